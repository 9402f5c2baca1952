"""The sidecar-injection webhook of `pilot discovery`: its HTTPS listener (`server`), its
serving certificate (`serving`), what it counts and logs (`refusals`), the answer to one
review (`reviews`, over `pilot.inject`), and in Kubernetes mode the caBundle of pilot's own
MutatingWebhookConfiguration (`ca_bundle`)."""
