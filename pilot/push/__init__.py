"""From registry changes to pushes: debouncing, merging, and fan-out bookkeeping."""
