"""Build ragmesh's default cross-encoder: mine training groups with our own retrieval legs, fine-tune
all-MiniLM-L6-v2's weights listwise, export an int8 ONNX model directory with its manifest.

torch is needed only here (``make reranker-model`` installs it); the reranker service runs the
exported ONNX file with ONNX Runtime alone.
"""
