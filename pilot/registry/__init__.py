"""The service registry: Kubernetes-shaped objects, parsed, and the endpoint index."""
