"""The process pilot runs as: its supervised tasks and their backoff, the event loop, and
how its C and Python heaps give memory back."""
