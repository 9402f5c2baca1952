"""Fuzzing every gRPC method of a real `pilot discovery` process (issue 9, item 7).

Layout:

- `methods`: every method pilot serves; `calls`: what one example sends;
- `strategies`: Hypothesis strategies, random bytes and hostile-but-valid calls;
- `exchange`: performing a call (blocking gRPC API) and its `Outcome`;
- `target`: the pilot under fuzz (file or Kubernetes mode), on a `loop.LoopThread`;
- `ready`: timing `/ready`; `properties`: what must hold after each example;
- `fuzzer`: one example end to end; `known`: today's defects, tolerated by the
  search and reproduced one by one in `test_known_defects`;
- `cycles`: streams that connect, subscribe and go away (leak checks).

`python -m bench.fuzz` runs the same examples by the ten thousand.
"""
