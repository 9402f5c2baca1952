"""pilot's sidecar-injection webhook, called as the API server calls it, on the real
`pilot discovery --config examples/mesh.yaml` (the webhook runs in every mode).

Honest calls first: a Pod's review is answered with the sidecar's JSON patch and the
request's uid, over TLS that verifies against pilot's root for the Service's names.
Then the bad input Istio's webhook answers (404, 405, 400 empty or over 6 MiB, 415, 400
undecodable, allowed false for a template error), pilot's own bounds (429 past
PILOT_MAX_INJECTION_REVIEWS, 408 for a body that never ends, a lying Content-Length
never read past), and hostile callers (TLS garbage, plaintext, connections that say
nothing, fuzz-style bodies): pilot stays up, `/ready` stays 200, and the next honest
review is answered. Each refusal is counted and logged in one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from pathlib import Path

import pytest

from tests.integration.webhook_client import patched, post, raw, response_of, status_of
from tests.support.admission import pod_review, review_body
from tests.support.deadline import bounded
from tests.support.envoy_process import EXAMPLES_DIR
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca

MESH = EXAMPLES_DIR / "mesh.yaml"
SIX_MIB = 6 * 1024 * 1024


def _pod(name: str = "cart", **annotations: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": name},
                     "annotations": annotations},
        "spec": {"containers": [{"name": name, "image": f"{name}:1",
                                 "ports": [{"containerPort": 8080}]}]},
    }  # fmt: skip


async def _pilot(tmp_path: Path, **env: str) -> PilotProcess:
    pilot = await start_file_pilot_with_ca(
        tmp_path, MESH, env={"POD_NAMESPACE": "pilot-system", **env}
    )
    assert pilot.webhook_port, "no webhook line in pilot's log"
    return pilot


async def _metric(pilot: PilotProcess, name: str, label: str = "") -> float:
    status, body = await pilot.get("/metrics")
    assert status == 200
    pattern = rf"^{re.escape(name)}(?:{{{re.escape(label)}}})? (\S+)$"
    found = re.findall(pattern, body, re.M)
    assert found, f"{name} {label} not on /metrics"
    return float(found[0])


async def _ready(pilot: PilotProcess) -> int:
    return (await pilot.get("/ready"))[0]


def _added(patch: list[dict[str, object]], path: str) -> list[object]:
    return [op["value"] for op in patch if op["op"] == "add" and op["path"] == path]


# --------------------------------------------------------------------------- honest


@pytest.fixture
async def pilot(tmp_path: Path) -> object:
    running = await _pilot(tmp_path)
    yield running
    await running.stop()


async def test_a_pod_review_is_answered_with_the_sidecar(pilot: PilotProcess) -> None:
    body = review_body(_pod(), uid="3f1b0c2e-uid")
    status, answer = await post(pilot.webhook_port, pilot.root_pem, body,
                                server_name="pilot.pilot-system.svc")  # fmt: skip
    assert status == 200, answer
    response = response_of(answer)
    assert response["uid"] == "3f1b0c2e-uid" and response["allowed"] is True
    patch = patched(answer)
    containers = json.dumps(patch)
    assert '"istio-proxy"' in containers and '"istio-init"' in containers
    assert await _metric(pilot, "sidecar_injection_requests_total") == 1
    assert await _metric(pilot, "sidecar_injection_success_total") == 1


@pytest.mark.parametrize(
    "name", ["pilot", "pilot.pilot-system", "pilot.pilot-system.svc",
             "pilot.pilot-system.svc.cluster.local"],
)  # fmt: skip
async def test_the_certificate_names_pilots_service(pilot: PilotProcess, name: str) -> None:
    status, _ = await post(pilot.webhook_port, pilot.root_pem, review_body(_pod()),
                           server_name=name)  # fmt: skip
    assert status == 200


async def test_a_name_pilot_does_not_serve_fails_verification(pilot: PilotProcess) -> None:
    with pytest.raises(Exception, match=r"certificate|hostname"):
        await post(pilot.webhook_port, pilot.root_pem, review_body(_pod()),
                   server_name="evil.example")  # fmt: skip


async def test_a_pod_that_opts_out_is_allowed_without_a_patch(pilot: PilotProcess) -> None:
    body = review_body(_pod(**{"sidecar.istio.io/inject": "false"}), uid="u-skip")
    status, answer = await post(pilot.webhook_port, pilot.root_pem, body)
    response = response_of(answer)
    assert (status, response["uid"], response["allowed"]) == (200, "u-skip", True)
    assert "patch" not in response
    assert await _metric(pilot, "sidecar_injection_skip_total") == 1


async def test_a_hundred_concurrent_reviews_are_all_answered(pilot: PilotProcess) -> None:
    async def one(index: int) -> str:
        body = review_body(_pod(f"app{index}"), uid=f"uid-{index}")
        status, answer = await post(pilot.webhook_port, pilot.root_pem, body)
        response = response_of(answer)
        assert status == 200 and response["allowed"] and patched(answer)
        return str(response["uid"])

    uids = await asyncio.gather(*(one(i) for i in range(100)))
    assert sorted(uids) == sorted(f"uid-{i}" for i in range(100))
    assert await _metric(pilot, "sidecar_injection_success_total") == 100


async def test_ready_answers_while_large_reviews_are_decoded(pilot: PilotProcess) -> None:
    """Reviews of nearly 6 MiB are decoded on the worker threads: the loop answers /ready
    meanwhile (how fast is bench.inject's figure, not this test's)."""
    big = _pod(**{"example.com/blob": "x" * (SIX_MIB - 4096)})
    bodies = [review_body(big, uid=f"big-{i}") for i in range(4)]
    assert all(len(body) < SIX_MIB for body in bodies)
    posts = asyncio.gather(*(post(pilot.webhook_port, pilot.root_pem, b) for b in bodies))
    probes = []
    while not posts.done():
        probes.append(await _ready(pilot))
    answers = await posts
    assert [status for status, _ in answers] == [200] * 4
    assert probes and set(probes) == {200}


# --------------------------------------------------------------------------- Istio's bad input


async def test_bad_requests_get_istios_answers(pilot: PilotProcess) -> None:
    port, root = pilot.webhook_port, pilot.root_pem
    body = review_body(_pod())
    assert (await post(port, root, body, path="/mutate"))[0] == 404
    assert (await post(port, root, b"", method="GET"))[0] == 405
    assert (await post(port, root, b""))[0] == 400
    assert (await post(port, root, body, content_type="text/yaml"))[0] == 415
    assert (await post(port, root, body, content_type=None))[0] == 415
    assert (await post(port, root, b"{not json"))[0] == 400
    assert (await post(port, root, b'{"kind": "AdmissionReview"}'))[0] == 400
    assert (await post(port, root, b"x" * (SIX_MIB + 1)))[0] == 400
    assert (await post(port, root, body, path="/inject/"))[0] == 200
    lines = pilot.logged(lambda e: "injection webhook refused" in e["msg"])
    assert len(lines) == 6, [e["msg"] for e in lines]  # one per kind (two 415s, two 400s)
    assert await _metric(pilot, "pilot_injection_refusals_total", 'reason="content_type"') == 2


async def test_a_template_error_refuses_the_pod_with_the_message(pilot: PilotProcess) -> None:
    hostile = "15001\n-j ACCEPT"  # a port list that would reach iptables' command line
    pod = _pod(**{"traffic.sidecar.istio.io/excludeInboundPorts": hostile})
    status, answer = await post(pilot.webhook_port, pilot.root_pem,
                                review_body(pod, uid="u-bad"))  # fmt: skip
    response = response_of(answer)
    assert (status, response["uid"], response["allowed"]) == (200, "u-bad", False)
    assert "excludeInboundPorts" in response["status"]["message"]
    assert await _metric(pilot, "sidecar_injection_failure_total") == 1
    (line,) = pilot.logged(lambda e: "refused Pod (uid u-bad)" in e["msg"])
    assert "\n" not in line["msg"], "the annotation's newline reached the log unescaped"


async def test_a_content_length_over_the_bound_is_refused_unread(pilot: PilotProcess) -> None:
    reader, writer = await raw(pilot.webhook_port, pilot.root_pem)
    writer.write(b"POST /inject HTTP/1.1\r\nHost: pilot\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 7000000\r\n\r\n{")  # fmt: skip
    await writer.drain()
    assert await status_of(reader) == 400  # answered with 6,999,999 bytes never sent
    writer.close()


async def test_a_chunked_body_is_read_only_to_the_bound(pilot: PilotProcess) -> None:
    reader, writer = await raw(pilot.webhook_port, pilot.root_pem)
    writer.write(b"POST /inject HTTP/1.1\r\nHost: pilot\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    chunk = b"x" * 65536
    answered = asyncio.ensure_future(status_of(reader))
    sent = 0
    while not answered.done() and sent < 2 * SIX_MIB:  # a body that would go on for ever
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sent += len(chunk)
        try:
            await writer.drain()
        except ConnectionError:
            break
    assert await answered == 400
    writer.close()


# --------------------------------------------------------------------------- pilot's bounds


async def test_a_body_that_never_ends_gets_408_and_pilot_stays_ready(tmp_path: Path) -> None:
    pilot = await _pilot(tmp_path, PILOT_INJECTION_BODY_TIMEOUT="1s")
    try:
        reader, writer = await raw(pilot.webhook_port, pilot.root_pem)
        writer.write(b"POST /inject HTTP/1.1\r\nHost: pilot\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 100\r\n\r\n{")  # fmt: skip
        await writer.drain()
        assert await _ready(pilot) == 200
        assert await status_of(reader) == 408
        writer.close()
        assert await _metric(pilot, "pilot_injection_refusals_total", 'reason="slow_body"') == 1
    finally:
        await pilot.stop()


async def test_headers_that_never_end_are_cut_off(tmp_path: Path) -> None:
    """Slowloris: a connection that never completes its request's headers is closed."""
    pilot = await _pilot(tmp_path, PILOT_INJECTION_BODY_TIMEOUT="1s")
    try:
        reader, writer = await raw(pilot.webhook_port, pilot.root_pem)
        writer.write(b"POST /inject HTTP/1.1\r\nHo")
        await writer.drain()
        assert await bounded(reader.read(), 30) == b"", "answered a request never sent"
        writer.close()
        assert await _ready(pilot) == 200
    finally:
        await pilot.stop()


async def test_reviews_past_the_bound_get_429(tmp_path: Path) -> None:
    pilot = await _pilot(tmp_path, PILOT_MAX_INJECTION_REVIEWS="2")
    try:
        held = []
        for _ in range(2):  # two reviews whose bodies are still coming
            reader, writer = await raw(pilot.webhook_port, pilot.root_pem)
            writer.write(b"POST /inject HTTP/1.1\r\nHost: pilot\r\nContent-Type: application/"
                         b"json\r\nContent-Length: 100\r\n\r\n{")  # fmt: skip
            await writer.drain()
            held.append((reader, writer))
        status = 0
        for _ in range(50):  # until both are being read: then the third is one too many
            status, _ = await post(pilot.webhook_port, pilot.root_pem, review_body(_pod()))
            if status == 429:
                break
        assert status == 429
        for _, writer in held:
            writer.close()
        assert (await post(pilot.webhook_port, pilot.root_pem, review_body(_pod())))[0] == 200
    finally:
        await pilot.stop()


async def test_bodies_past_the_bytes_bound_get_429(tmp_path: Path) -> None:
    pilot = await _pilot(tmp_path, PILOT_MAX_INJECTION_BYTES=str(SIX_MIB))
    try:
        _, writer = await raw(pilot.webhook_port, pilot.root_pem)
        writer.write(b"POST /inject HTTP/1.1\r\nHost: pilot\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 4000000\r\n\r\n{")  # fmt: skip
        await writer.drain()  # 4 MB promised, held while it comes
        status = 0
        for _ in range(50):  # once the first is being read, 3 MB more is past 6 MiB
            status, _ = await post(pilot.webhook_port, pilot.root_pem, b" " * 3_000_000)
            if status == 429:
                break
        assert status == 429
        writer.close()
        # a small review still fits beside the 4 MB one
        assert (await post(pilot.webhook_port, pilot.root_pem, review_body(_pod())))[0] == 200
    finally:
        await pilot.stop()


async def test_sigterm_while_a_body_is_still_coming_exits_cleanly(tmp_path: Path) -> None:
    pilot = await _pilot(tmp_path)
    _, writer = await raw(pilot.webhook_port, pilot.root_pem)
    writer.write(b"POST /inject HTTP/1.1\r\nHost: pilot\r\nContent-Type: application/json"
                 b"\r\nContent-Length: 100\r\n\r\n{")  # fmt: skip
    await writer.drain()
    await _ready(pilot)  # the request is in: its headers came before this probe's
    await pilot.stop()  # exits 0 in time, or fails
    writer.close()


async def test_the_webhook_can_be_turned_off(tmp_path: Path) -> None:
    pilot = await start_file_pilot_with_ca(tmp_path, MESH, "--webhook-addr", "")
    try:
        assert pilot.webhook_port == 0
        assert await _metric(pilot, "sidecar_injection_requests_total") == 0
    finally:
        await pilot.stop()


# --------------------------------------------------------------------------- hostile callers


async def test_garbage_and_half_open_connections_never_stop_the_webhook(
    pilot: PilotProcess,
) -> None:
    port = pilot.webhook_port
    silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
    for garbage in (b"\x16\x03\x01\x00\x05hello", b"GET / HTTP/1.1\r\n\r\n", os.urandom(4096)):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(garbage)
        await writer.drain()
        writer.close()
    head = b"POST /inject HTTP/1.1\r\nHost: pilot\r\nContent-Type: application/json\r\n"
    for after_tls in (
        b"\x00\xff" * 2048 + b"\r\n\r\n",  # not HTTP
        head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",  # a broken chunk size
        head + b"Content-Length: 100\r\n\r\n{",  # then gone mid-body
        head + b"Transfer-Encoding: chunked\r\n\r\n5\r\nab",  # the same, chunked
    ):
        reader, writer = await raw(port, pilot.root_pem)
        writer.write(after_tls)
        await writer.drain()
        if after_tls.endswith(b"\n\r\n"):
            await bounded(reader.read(), 30)  # answered (400) and closed
        writer.close()
    for body in (
        b"[]",
        b"null",
        b'{"request": []}',
        b'{"request": {"uid": 7}}',
        json.dumps(pod_review({"spec": "x"})).encode(),
        b"\xff\xfe",
        b"9" * 5000,
    ):
        status, _ = await post(port, pilot.root_pem, body)
        assert status in (200, 400), (body[:40], status)  # fmt: skip
    assert await _ready(pilot) == 200
    status, answer = await post(port, pilot.root_pem, review_body(_pod(), uid="after"))
    assert status == 200 and response_of(answer)["uid"] == "after"
    assert pilot.alive
    for _, silent_writer in silent:
        silent_writer.close()
    # Each kind in a line of pilot's, never a traceback: a caller decides nothing of the log.
    assert pilot.logged(lambda e: bool(e["error"]) or e["level"] == "error") == []
    assert await _metric(pilot, "pilot_injection_refusals_total", 'reason="malformed"') >= 2


_NASTY: list[object] = [
    None, True, 0, -1, 2**70, 1.5e308, "", "x" * 70_000, "\n\x00<script>", "../../etc",
    [], {}, [[[[[]]]]], {"": {"": {}}}, "\ud800", "١٢٣", {"$ref": "#"},
]  # fmt: skip


def _mutated(rng: random.Random, review: object, depth: int = 0) -> object:
    """`review` with some of its values, at any depth, replaced by hostile ones."""
    if rng.random() < 0.08:
        return rng.choice(_NASTY)
    if isinstance(review, dict):
        mutated = {k: _mutated(rng, v, depth + 1) for k, v in review.items()}
        if rng.random() < 0.1:
            mutated[rng.choice(["", "x" * 300, "\n", "metadata"])] = rng.choice(_NASTY)
        return mutated
    if isinstance(review, list):
        return [_mutated(rng, v, depth + 1) for v in review]
    return review


async def test_hundreds_of_mutated_reviews_get_answers_and_pilot_stays(
    pilot: PilotProcess,
) -> None:
    """Fuzz-style: a valid Pod review with hostile values anywhere; every answer is a
    review echoing the uid it can read, or a 400, and pilot keeps serving."""
    rng = random.Random(38)
    base = pod_review(_pod(**{"proxy.istio.io/config": '{"concurrency": 2}'}), uid="fuzz")
    base["request"]["object"]["spec"]["initContainers"] = [{"name": "i", "image": "i"}]
    statuses = []
    for _ in range(300):
        body = json.dumps(_mutated(rng, base)).encode()
        status, answer = await post(pilot.webhook_port, pilot.root_pem, body)
        statuses.append(status)
        assert status in (200, 400), (status, body[:200])
        if status == 200:
            response = response_of(answer)
            assert isinstance(response["allowed"], bool) and isinstance(response["uid"], str)
    assert statuses.count(200) > 10 and statuses.count(400) > 10, "the mutations miss"
    assert await _ready(pilot) == 200
    assert pilot.logged(lambda e: bool(e["error"]) or e["level"] == "error") == []


async def test_plaintext_http_gets_no_answer(pilot: PilotProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", pilot.webhook_port)
    writer.write(b"POST /inject HTTP/1.1\r\nHost: pilot\r\nContent-Length: 2\r\n\r\n{}")
    await writer.drain()
    assert await bounded(reader.read(), 30) == b"", "answered over plaintext"
    writer.close()
