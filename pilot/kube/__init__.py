"""The Kubernetes API client kit: finding the API server (connection, kubeconfig), the
client whose every request has an end, informers (list and watch, metadata only), the
one-line reading of a refusal, and their settings. What both sources/ (the registry)
and security/ (the Lease, the CA Secret, the root ConfigMaps, TokenReview) use."""
