"""The gRPC platform: server, interceptors, keys, identities, TLS, client, metrics (README.md)."""
