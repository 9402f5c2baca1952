"""The agent's pure parts: istio-iptables' rules from flags, the bootstrap from the pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot.agent.bootstrap import BootstrapError, ProxyNode, XdsTarget, bootstrap
from pilot.agent.iptables import CaptureError, CaptureSettings, capture_rules, parse_ports
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
