"""The generators: one per resource kind the pipeline builds (clusters and their
assignments, outbound listeners, routes, each sidecar's inbound side, secrets), each
keeping what it built in step with the registry and calling the pure builders
(`pilot.builders`)."""
