"""meshkit: the platform every ragmesh service is built on.

Settings from the environment, the grpc.aio service bootstrap (health, reflection, graceful
shutdown, interceptors, metrics), structured logging with request ids, and the client factory
that guards outgoing calls with deadlines, retries and circuit breakers.
"""
