"""The push pipeline: submit -> debounce -> build -> cache -> fan-out, for every type."""
