"""pilot test suite."""
