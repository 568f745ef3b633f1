"""Running models in-process: ONNX Runtime sessions, micro-batching (README.md)."""
