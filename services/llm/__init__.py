"""The local default LLM server: llama.cpp's OpenAI-compatible HTTP server (from xllamacpp) serving
a GGUF model. Production points ``RAGMESH_LLM_BASE_URL`` at vLLM or any other compatible server."""
