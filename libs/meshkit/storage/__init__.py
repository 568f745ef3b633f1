"""Connections to NATS and the S3 object store (README.md)."""
