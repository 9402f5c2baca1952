"""xDS vocabulary shared by every layer: type URLs, push order, encoded resources."""
