"""Pure functions from registry values to Envoy resources (CDS, EDS)."""
