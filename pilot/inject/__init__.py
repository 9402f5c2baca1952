"""Sidecar injection (issue 38): Istio's injection template as pure Python.

Pure and synchronous: no I/O, no asyncio, so the webhook may call `review.answer`
from worker threads and `pilot kube-inject` calls the same functions offline.
`settings` (what the operator chose), `decision` (inject or not), `pod` (the
template), `annotations` (what a pod may ask, validated), `probes` (app probes
moved to the agent's status port), `patch` (RFC 6902 from old to new), `review`
(AdmissionReview in and out) and `workloads` (pod templates inside workload kinds).
"""
