"""Kubernetes as a source of the registry: each cluster's informers (Services,
EndpointSlices or Endpoints, Pods, Nodes), remote clusters, and PeerAuthentications."""
