"""Errors, logs with request ids, durable file writes: what every layer speaks (README.md)."""
