"""Reranker service: a cross-encoder that orders the gateway's fused candidates."""
