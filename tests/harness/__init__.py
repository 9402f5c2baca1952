"""Harness for integration tests: real Envoy processes and deadline-bound waiting."""
