"""Pure functions from registry values to Envoy resources: clusters, assignments,
outbound listeners and routes, the inbound side, auto mTLS, Istio's names and protocol
selection. No state: the generators (`pilot.generators`) keep what changed and call these."""
