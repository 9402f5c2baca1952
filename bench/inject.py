"""`python -m bench.inject`: the sidecar-injection webhook's reviews per second and
latency, with 100 reviews in flight at once.

One real `pilot discovery --config examples/mesh.yaml` subprocess, its webhook on an
ephemeral loopback port; this process is the API server: it keeps `--concurrency`
AdmissionReviews in flight (each a Pod of three containers with probes, one TLS
connection per caller, kept alive, verifying pilot's certificate against its root) until
`--reviews` are answered, and checks every answer (HTTP 200, the uid echoed, a patch).
A process of its own probes pilot's `/ready` meanwhile (tests.fuzz.ready): the reviews
run on pilot's worker threads, and its event loop must keep answering.

Prints reviews per second, p50, p99 and the slowest review, and the slowest `/ready`
during the run. The machine's cores are shared by pilot and this caller (TLS and JSON
on both sides): the figures are what one pilot gives on it, not a ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.pilot_cli import SERVING, newer_flags, serving_ports
from bench.procs import PYTHON, ROOT, Child, log_match, spawn
from tests.fuzz.ready import ReadyProber

WEBHOOK = re.compile(r"sidecar injection webhook on 127\.0\.0\.1:(\d+) ")
WAIT = 60.0


@dataclass(frozen=True)
class Figures:
    reviews: int
    concurrency: int
    seconds: float
    p50: float
    p99: float
    slowest: float
    worst_ready: float

    @property
    def per_second(self) -> float:
        return self.reviews / self.seconds


def _pod(index: int) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5}
    containers = [
        {
            "name": name,
            "image": f"registry.example/{name}:1.{index}",
            "ports": [{"containerPort": 8080 + n, "name": f"http-{n}"}],
            "env": [{"name": "MODE", "value": "production"}],
            "readinessProbe": probe,
            "livenessProbe": probe,
        }
        for n, name in enumerate(("app", "worker", "metrics"))
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "cart-7d4f9-",
            "namespace": "shop",
            "labels": {"app": "cart", "version": "v1", "pod-template-hash": "7d4f9"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "cart-7d4f9",
                    "uid": "u",
                    "controller": True,
                }
            ],
        },
        "spec": {"serviceAccountName": "cart", "containers": containers},
    }


def review(index: int) -> bytes:
    """An AdmissionReview as kube-apiserver sends it for a ReplicaSet's Pod."""
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"review-{index}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "shop",
                "operation": "CREATE",
                "object": _pod(index),
            },
        }
    ).encode()


def _check(index: int, status: int, body: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"review {index}: HTTP {status}: {body[:200]!r}")
    response = json.loads(body)["response"]
    if response.get("uid") != f"review-{index}" or not response.get("allowed"):
        raise RuntimeError(f"review {index}: {str(response)[:300]}")
    if not json.loads(base64.b64decode(response["patch"])):
        raise RuntimeError(f"review {index}: an empty patch")


async def _caller(
    session: aiohttp.ClientSession, url: str, indices: list[int], latencies: list[float]
) -> None:
    headers = {"Content-Type": "application/json"}
    while indices:
        index = indices.pop()
        body = review(index)
        started = time.monotonic()
        async with session.post(url, data=body, headers=headers) as answer:
            text = await answer.read()
        latencies.append(time.monotonic() - started)
        _check(index, answer.status, text)


async def drive(port: int, root: Path, reviews: int, concurrency: int) -> tuple[float, list[float]]:
    """Seconds for `reviews` reviews, `concurrency` in flight; each one's latency."""
    context = ssl.create_default_context(cafile=str(root))
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    indices = list(range(reviews))
    latencies: list[float] = []
    url = f"https://localhost:{port}/inject"
    async with aiohttp.ClientSession(connector=connector) as session:
        await _caller(session, url, [reviews], [])  # warm: one connection, the first review
        started = time.monotonic()
        await asyncio.gather(
            *(_caller(session, url, indices, latencies) for _ in range(concurrency))
        )
        return time.monotonic() - started, latencies


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(reviews: int, concurrency: int, workdir: Path) -> Figures:
    argv = [PYTHON, "-m", "pilot", "discovery", "--config", str(ROOT / "examples/mesh.yaml")]
    argv += ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json"]
    argv += [*newer_flags(workdir), "--webhook-addr", "127.0.0.1:0"]
    child: Child = await spawn("pilot", argv, workdir / "pilot.log")
    prober: ReadyProber | None = None
    try:
        async with asyncio.timeout(WAIT):
            port = int((await log_match(child, WEBHOOK))[1])
            _, http_port = serving_ports(await log_match(child, SERVING))
        prober = ReadyProber(http_port)
        await prober.start()
        prober.reset()
        since = time.monotonic()
        seconds, latencies = await drive(
            port, workdir / "ca" / "root-cert.pem", reviews, concurrency
        )
        await prober.window(since)
        worst = prober.worst
        return Figures(
            reviews,
            concurrency,
            seconds,
            _quantile(latencies, 0.5),
            _quantile(latencies, 0.99),
            max(latencies),
            worst.latency if worst is not None else float("nan"),
        )
    finally:
        if prober is not None:
            await prober.stop()
        await child.stop()


def render(f: Figures) -> str:
    return "\n".join(
        [
            "| reviews | in flight | reviews per second | p50 | p99 | slowest | slowest /ready |",
            "|---|---|---|---|---|---|---|",
            f"| {f.reviews:,} | {f.concurrency} | {f.per_second:,.0f} | {f.p50 * 1000:.0f} ms"
            f" | {f.p99 * 1000:.0f} ms | {f.slowest * 1000:.0f} ms"
            f" | {f.worst_ready * 1000:.0f} ms |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inject", description=__doc__)
    parser.add_argument("--reviews", type=int, default=5000, help="reviews in all (5000)")
    parser.add_argument("--concurrency", type=int, default=100, help="in flight at once (100)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pilot-bench-inject-") as folder:
        print(
            f"[bench.inject] {args.reviews:,} reviews, {args.concurrency} at once", file=sys.stderr
        )
        figures = asyncio.run(measure(args.reviews, args.concurrency, Path(folder)))
    print(render(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
