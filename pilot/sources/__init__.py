"""Where the registry comes from: a file of Kubernetes objects, or a live cluster."""
