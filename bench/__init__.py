"""Benchmarks of pilot; `python -m bench.eds_push` measures endpoint-change pushes,
`python -m bench.fuzz` fuzzes every gRPC method and soaks pilot with short-lived streams.

Modules: `eds_push` (command line, report), `run` (processes and phases),
`clients` and `floor` (the client and floor-server processes), `fleet`
(driving client processes), `kube` (the test API server: changes and a watch),
`workload` (mesh and changes), `procs` (child processes, /proc, CPU clocks),
`report` (figures and table), `pilot_cli` (pilot's flags), `wire` (xDS bits),
`peers` (the go-control-plane peer: `bench/gcp`, a Go module, and its build);
`fuzz` (command line, phases) and `fuzz_tally` (counts, targets, report), which
run tests/fuzz's examples and cycles; `codecs` (protobuf, pilot's hand encoder and
envoy-data-plane on one ClusterLoadAssignment).
"""
