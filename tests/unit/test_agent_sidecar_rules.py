"""The agent's pure parts: istio-iptables' rules from flags, the bootstrap from the pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot.agent.bootstrap import BootstrapError, ProxyNode, XdsTarget, bootstrap
from pilot.agent.iptables import (
    MAX_ENTRIES,
    CaptureError,
    CaptureSettings,
    capture_rules,
    check_mode,
    parse_ports,
    parse_ranges,
)
from pilot.security.identity import Identity

IDENTITY = Identity("cluster.local", "shop", "cart")


def _rules(**settings: object) -> list[str]:
    return capture_rules(CaptureSettings(**settings)).splitlines()  # type: ignore[arg-type]


def test_default_rules_are_one_nat_transaction() -> None:
    rules = _rules()
    assert rules[0] == "*nat" and rules[-1] == "COMMIT"
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules
    assert "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006" in rules
    assert rules[-2] == "-A ISTIO_OUTPUT -j ISTIO_REDIRECT"  # after every exemption
    for port in (15090, 15021, 15020):
        assert f"-A ISTIO_INBOUND -p tcp --dport {port} -j RETURN" in rules


def test_listed_inbound_ports_only_and_excluded_outbound_ports() -> None:
    rules = _rules(inbound_ports=(9080, 15021), exclude_outbound_ports=(3306,))
    assert "-A ISTIO_INBOUND -p tcp --dport 9080 -j ISTIO_IN_REDIRECT" in rules
    assert not any("--dport 15021 -j ISTIO_IN_REDIRECT" in rule for rule in rules)
    assert "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT" not in rules
    assert "-A ISTIO_OUTPUT -p tcp --dport 3306 -j RETURN" in rules


@pytest.mark.parametrize("text", ["0", "65536", "80;reboot", "-1", "1e3"])
def test_ports_that_are_not_ports(text: str) -> None:
    with pytest.raises(CaptureError, match="is not a port"):
        parse_ports("-d", text)


def test_wildcard_only_where_allowed() -> None:
    assert parse_ports("-b", "*", wildcard=True) is None
    with pytest.raises(CaptureError):
        parse_ports("-d", "*")
    with pytest.raises(CaptureError, match="-u 4294967295"):
        capture_rules(CaptureSettings(proxy_uid=2**32 - 1))


def test_outbound_ranges_and_ports_in_istios_order() -> None:
    """Excluded ranges RETURN before any inclusion; included ports, then ranges, redirect."""
    rules = _rules(
        exclude_outbound_ranges=("10.1.0.0/16",),
        include_outbound_ports=(443,),
        include_outbound_ranges=("10.0.0.0/8", "198.19.0.0/16"),
    )
    tail = rules[rules.index("-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN") + 1 : -1]
    assert tail == [
        "-A ISTIO_OUTPUT -d 10.1.0.0/16 -j RETURN",
        "-A ISTIO_OUTPUT -p tcp --dport 443 -j ISTIO_REDIRECT",
        "-A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT",
        "-A ISTIO_OUTPUT -d 198.19.0.0/16 -j ISTIO_REDIRECT",
    ]
    assert "-A ISTIO_OUTPUT -j ISTIO_REDIRECT" not in rules
    none = _rules(include_outbound_ranges=())
    assert not any(rule.endswith("-j ISTIO_REDIRECT") and "ISTIO_OUTPUT" in rule for rule in none)


def test_ranges_are_cidrs() -> None:
    assert parse_ranges("-i", "*", wildcard=True) is None
    assert parse_ranges("-i", "", wildcard=True) == ()
    assert parse_ranges("-x", " 10.1.2.3/8 , 10.0.0.0/8,") == ("10.0.0.0/8",)
    assert parse_ranges("-x", "fd00::/8,192.168.0.0/16") == ("192.168.0.0/16",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.0", "is not a CIDR"),
        ("10.0.0.0/33", "is not a CIDR"),
        ("10.0.0.0/8 -j ACCEPT", "is not a CIDR"),
        ("10.0.0.0/8\n-A OUTPUT -j ACCEPT", "is not a CIDR"),
        ("*", "is not a CIDR"),
        ("fd00::/8", "IPv6 ranges cannot be captured"),
    ],
    ids=["no-prefix", "prefix", "rule", "newline", "wildcard", "ipv6"],
)
def test_ranges_that_are_not_ranges(text: str, message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        parse_ranges("-i", text, ipv6=False)


def test_lists_are_bounded() -> None:
    ports = ",".join(str(port) for port in range(1, MAX_ENTRIES + 2))
    with pytest.raises(CaptureError, match=f"-q: {MAX_ENTRIES + 1} entries, at most"):
        parse_ports("-q", ports)
    ranges = ",".join(f"10.0.{n // 256}.{n % 256}/32" for n in range(MAX_ENTRIES + 1))
    with pytest.raises(CaptureError, match=f"at most {MAX_ENTRIES}"):
        parse_ranges("-x", ranges)


def test_only_redirect_mode() -> None:
    assert check_mode("REDIRECT") == "REDIRECT"
    with pytest.raises(CaptureError, match="-m TPROXY: not supported"):
        check_mode("TPROXY")
    with pytest.raises(CaptureError, match="not an interception mode"):
        check_mode("redirect;reboot")


def test_no_token_file_no_call_credentials() -> None:
    node = ProxyNode.from_env({"POD_NAME": "cart-0", "POD_IP": "198.18.0.2"}, IDENTITY)
    config = bootstrap(node, XdsTarget("pilot:15012", Path("root.pem")), Path("sock"))
    [service] = config["dynamic_resources"]["ads_config"]["grpc_services"]
    assert "call_credentials" not in service["google_grpc"]
    assert service["google_grpc"]["target_uri"] == "pilot:15012"


@pytest.mark.parametrize("address", ["pilot", "pilot:0", "pilot:x", "a b:15012", "\n:1"])
def test_discovery_addresses_that_are_not_host_port(address: str) -> None:
    with pytest.raises(BootstrapError, match="expected HOST:PORT"):
        XdsTarget(address, Path("root.pem"))
