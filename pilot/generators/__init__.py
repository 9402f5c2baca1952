"""The generators, one per type the pipeline builds: clusters (cds), assignments (eds),
outbound listeners (lds), routes (rds), each sidecar's own inbound listener and clusters
(inbound_proxies), secrets (sds). Each keeps what it built in step with the registry
and calls the pure builders (`pilot.builders`)."""
