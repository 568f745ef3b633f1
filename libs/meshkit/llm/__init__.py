"""The LLM client: OpenAI-compatible servers and vLLM (README.md)."""
