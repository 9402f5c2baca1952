"""`pilot agent iptables` in a pod's network namespace: what it captures, and what not.

Two pods (tests/support/pods: network namespaces on a bridge, 198.18.0.2 and .3).
Pod B runs the test HTTP backend on its app port 9080. In pod A the agent's
capture rules are set as an init step (`ip netns exec A pilot agent iptables`,
root), and listeners that answer with SO_ORIGINAL_DST (tests/support/original_dst)
stand where Envoy would: 15001, 15006, 15021, 15090 and the app port 9080. Then:

- the app (uid 1000) dialling B:9080 lands on 15001, headed for B:9080;
- Envoy's user (uid 1337) dialling B:9080 reaches B's backend: not captured;
- B dialling A's app port lands on 15006, headed for A:9080;
- B dialling A's 15021 and 15090 reaches them: never captured;
- the app dialling 127.0.0.1 stays on loopback;
- a second run refuses (the rules are already there), and B has no rules at all;
- with `-i`/`-x`/`-q` only what is included lands on 15001 (a third pod, C, is the
  excluded range), the rest reaches its peer; values that are not port or CIDR lists,
  and `-m TPROXY`, are refused in one line with no rule set.

The full request path through two Envoys is test_mesh_traffic.py; this is the
capture under it. Nothing the harness made outlives the test, failing or not, and
what would leave the harness (a pod name that is a path, a hosts entry that is two
lines or an address outside 198.18.0.0/15) is refused before anything is made.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest

from tests.integration.agent_process import PILOT
from tests.support.pod_process import running_in
from tests.support.pods import Pod, leftovers, pod_network

APP_PORT = 9080
APP_UID = 1000
PROXY_UID = 1337
LISTENERS = (15001, 15006, 15021, 15090, APP_PORT)


async def _dial(pod: Pod, host: str, port: int, uid: int | None = None) -> str:
    """What a connection from `pod` (as `uid`) to host:port gets back first."""
    status, out, err = await pod.run(
        sys.executable, "-m", "tests.support.original_dst", "connect", host, str(port), uid=uid
    )
    assert status == 0, f"the dialler failed: {err}"
    return out.strip()


async def _landed(pod: Pod, host: str, port: int, uid: int | None = None) -> dict[str, Any]:
    answer = await _dial(pod, host, port, uid)
    assert answer.startswith("{"), f"{host}:{port} from {pod.name}: not a listener: {answer!r}"
    record: dict[str, Any] = json.loads(answer)
    return record


async def _nat_rules(pod: Pod) -> str:
    status, out, err = await pod.run("iptables-save", "-t", "nat")
    assert status == 0, err
    return out


async def test_capture_rules_send_the_pods_traffic_to_envoys_ports() -> None:
    async with pod_network(["a", "b"]) as network:
        a, b = network["a"], network["b"]
        status, _, err = await a.run(str(PILOT), "agent", "iptables")
        assert status == 0, err
        listen = [sys.executable, "-m", "tests.support.original_dst", "listen"]
        backend = [sys.executable, "-m", "tests.integration.http_backend"]
        async with (
            running_in(a, [*listen, *map(str, LISTENERS)], "listening"),
            running_in(b, [*backend, "--host", "0.0.0.0", "--port", str(APP_PORT)], "serving on"),
        ):
            outbound = await _landed(a, b.address, APP_PORT, uid=APP_UID)
            assert outbound["listener"] == 15001
            assert outbound["original_dst"] == f"{b.address}:{APP_PORT}"

            direct = await _dial(a, b.address, APP_PORT, uid=PROXY_UID)
            assert direct.startswith("HTTP/1."), f"uid 1337 was captured: {direct!r}"

            inbound = await _landed(b, a.address, APP_PORT)
            assert inbound["listener"] == 15006
            assert inbound["original_dst"] == f"{a.address}:{APP_PORT}"
            assert inbound["peer"].startswith(f"{b.address}:")

            for port in (15021, 15090):
                kept = await _landed(b, a.address, port)
                assert kept["listener"] == port, f"inbound {port} was captured: {kept}"

            local = await _landed(a, "127.0.0.1", APP_PORT, uid=APP_UID)
            assert local["listener"] == APP_PORT, f"loopback was captured: {local}"

        again, _, err = await a.run(str(PILOT), "agent", "iptables")
        assert again == 2
        assert "already set in this network namespace" in err
        assert "ISTIO_" not in await _nat_rules(b)
        assert (await _nat_rules(a)).count("-A ISTIO_OUTPUT -j ISTIO_REDIRECT") == 1
    assert leftovers(network) == []


async def _set_rules(pod: Pod, *flags: str) -> None:
    status, _, err = await pod.run(str(PILOT), "agent", "iptables", *flags)
    assert status == 0, err


async def test_outbound_ranges_and_ports_choose_what_is_captured() -> None:
    """istio-iptables' -i/-x (traffic.sidecar.istio.io/{in,ex}cludeOutboundIPRanges) and -q
    (includeOutboundPorts): what is included lands on 15001, the rest reaches the peer."""
    async with pod_network(["a", "b", "c"]) as network:
        a, b, c = network["a"], network["b"], network["c"]
        listen = [sys.executable, "-m", "tests.support.original_dst", "listen"]
        backend = [sys.executable, "-m", "tests.integration.http_backend", "--host", "0.0.0.0"]
        async with (
            running_in(a, [*listen, "15001", "15006"], "listening"),
            running_in(b, [*backend, "--port", "9081"], "serving on"),
            running_in(c, [*backend, "--port", str(APP_PORT)], "serving on"),
        ):
            await _set_rules(a, "-m", "REDIRECT", "-i", "198.18.0.0/24", "-x", f"{c.address}/32")
            assert (await _landed(a, b.address, APP_PORT, uid=APP_UID))["listener"] == 15001
            passed = await _dial(a, c.address, APP_PORT, uid=APP_UID)
            assert passed.startswith("HTTP/1."), f"the excluded range was captured: {passed!r}"

            assert (await a.run(str(PILOT), "agent", "iptables", "--cleanup"))[0] == 0
            await _set_rules(a, "-i", "", "-x", "", "-q", str(APP_PORT))
            included = await _landed(a, b.address, APP_PORT, uid=APP_UID)
            assert included["listener"] == 15001
            assert included["original_dst"] == f"{b.address}:{APP_PORT}"
            passed = await _dial(a, b.address, 9081, uid=APP_UID)
            assert passed.startswith("HTTP/1."), f"a port not included was captured: {passed!r}"
    assert leftovers(network) == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-m", "TPROXY"], "-m TPROXY: not supported; pilot sets REDIRECT rules only"),
        (["-i", "10.0.0.0/8,*"], "-i '10.0.0.0/8,*': '*' is not a CIDR (10.0.0.0/8)"),
        (["-x", "10.0.0.0/8 -j ACCEPT"], "-x '10.0.0.0/8 -j ACCEPT': '10.0.0.0/8 -j ACCEPT' is"),
        (["-i", "fd00::/8"], "-i 'fd00::/8': 'fd00::/8': IPv6 ranges cannot be captured"),
        (["-q", "443\n-A OUTPUT"], "-q '443\\n-A OUTPUT': '443\\n-A OUTPUT' is not a port"),
        (["-o", ",".join(["80"] * 300)], "-o: 300 entries, at most 256"),
    ],
    ids=["tproxy", "wildcard-in-list", "rule", "ipv6", "newline", "too-many"],
)
async def test_values_that_are_not_lists_are_refused_before_any_rule(
    flags: list[str], message: str
) -> None:
    async with pod_network(["a"]) as network:
        a = network["a"]
        status, _, err = await a.run(str(PILOT), "agent", "iptables", *flags)
        assert status == 2
        [line] = err.splitlines()
        assert line.startswith(f"pilot: error: {message}")
        assert "ISTIO_" not in await _nat_rules(a)
    assert leftovers(network) == []


async def test_cleanup_removes_the_rules() -> None:
    async with pod_network(["a"]) as network:
        a = network["a"]
        assert (await a.run(str(PILOT), "agent", "iptables"))[0] == 0
        status, _, err = await a.run(str(PILOT), "agent", "iptables", "--cleanup")
        assert status == 0, err
        assert "ISTIO_" not in await _nat_rules(a)
        assert (await a.run(str(PILOT), "agent", "iptables"))[0] == 0
    assert leftovers(network) == []


async def test_bad_ports_are_refused_before_any_rule() -> None:
    async with pod_network(["a"]) as network:
        a = network["a"]
        status, _, err = await a.run(str(PILOT), "agent", "iptables", "-d", "15090,99999")
        assert status == 2
        assert err.strip() == "pilot: error: -d '15090,99999': '99999' is not a port (1-65535)"
        assert "ISTIO_" not in await _nat_rules(a)


async def test_nothing_is_left_when_a_test_fails() -> None:
    made: list[Any] = []
    with pytest.raises(RuntimeError, match="the test failed"):
        async with pod_network(["a", "b"]) as network:
            made.append(network)
            listen = [sys.executable, "-m", "tests.support.original_dst", "listen", "9"]
            async with running_in(network["a"], listen, "listening"):
                raise RuntimeError("the test failed")
    assert leftovers(made[0]) == []


@pytest.mark.parametrize(
    ("names", "hosts", "message"),
    [
        (["../../etc"], {}, "pod name '../../etc'"),
        (["a", "a"], {}, "each name once"),
        (["a"], {"pilot\n198.51.100.1 evil": "198.18.0.2"}, "not a host name"),
        (["a"], {"pilot": "198.18.0.2 evil"}, "not an address in 198.18.0.0/15"),
        (["a"], {"pilot": "10.0.0.1"}, "not an address in 198.18.0.0/15"),
    ],
    ids=["path", "twice", "newline", "two-words", "outside"],
)
async def test_what_would_leave_the_harness_is_refused_before_anything_is_made(
    names: list[str], hosts: dict[str, str], message: str
) -> None:
    """A pod name becomes a path under /etc/netns and a namespace; a hosts entry, a line.
    The check comes first: it holds on machines that cannot make namespaces too."""
    with pytest.raises(ValueError, match=re.escape(message)):
        async with pod_network(names, hosts=hosts):
            pytest.fail("the harness made pods")
