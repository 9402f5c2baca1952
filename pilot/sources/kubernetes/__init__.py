"""The Kubernetes registry: informers over Services and EndpointSlices (or Endpoints)."""
