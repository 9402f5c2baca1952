"""The grpc.aio shell around the sans-I/O protocol: streams, services, the server."""
