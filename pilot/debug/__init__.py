"""What operators read: readiness and, later, metrics and debug endpoints."""
