"""The rows of `pilot proxy-config`, from CSDS answers built here.

What the real command shows against a real pilot and Envoy is in
tests/integration/test_proxy_config.py; here are the cases a live mesh does not
make on demand: a secret that still carries its private key (the rows must not
show it even then), several identities behind one node id, localities with and
without a region, resources CSDS sent no contents for.
"""

from __future__ import annotations

import datetime

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.status.v3 import csds_pb2

from pilot.debug import proxy_config
from pilot.debug.tables import FORMATS, formatted
from pilot.xds import types
from tests.integration.ca_support import issue_leaf, new_ca

URI = "spiffe://cluster.local/ns/shop/sa/cart"


def _config(node_id: str = "n", scope: str = "") -> csds_pb2.ClientConfig:
    config = csds_pb2.ClientConfig(client_scope=scope)
    config.node.id = node_id
    return config


def _add(config: csds_pb2.ClientConfig, type_url: str, name: str, resource: object | None) -> None:
    generic = config.generic_xds_configs.add(
        type_url=type_url, name=name, version_info="v1", config_status=csds_pb2.SYNCED
    )
    if resource is not None:
        generic.xds_config.Pack(resource)


def test_a_secret_with_its_key_shows_the_certificate_and_never_the_key() -> None:
    ca = new_ca("root")
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = issue_leaf(ca, key.public_key(), [URI])
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    secret = secret_pb2.Secret(name="default")
    secret.tls_certificate.certificate_chain.inline_bytes = leaf.public_bytes(
        serialization.Encoding.PEM
    )
    secret.tls_certificate.private_key.inline_bytes = key_pem
    config = _config()
    _add(config, types.SECRET, "default", secret)

    table = proxy_config.secrets(config)
    [record] = table.listed()
    assert record["san"] == URI
    assert record["serial_number"] == format(leaf.serial_number, "x")
    assert record["valid_cert"] is True
    body = b"".join(key_pem.splitlines()[1:-1]).decode()  # the key's base64, without PEM lines
    for output in FORMATS:
        text = formatted(table, output)
        assert "PRIVATE KEY" not in text and body[:32] not in text, f"{output} shows the key"


def test_a_resource_without_contents_is_a_row_of_its_state() -> None:
    config = _config()
    _add(config, types.SECRET, "default", None)
    _add(config, types.CLUSTER, "outbound|80||a.default.svc.cluster.local", None)
    [secret] = proxy_config.secrets(config).listed()
    assert secret["resource_name"] == "default" and secret["status"] == "SYNCED"
    assert secret["san"] is None and secret["serial_number"] is None
    [cluster] = proxy_config.clusters(config).listed()
    assert (cluster["type"], cluster["version"]) == (None, "v1")
    assert proxy_config.endpoints(config).listed() == []


@pytest.mark.parametrize(
    ("region", "zone", "sub_zone", "shown"),
    [
        ("", "", "", None),
        ("", "zone-a", "", "/zone-a"),
        ("r", "z", "", "r/z"),
        ("r", "z", "s", "r/z/s"),
    ],
)
def test_localities_are_written_as_istio_writes_them(
    region: str, zone: str, sub_zone: str, shown: str | None
) -> None:
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name="c")
    group = assignment.endpoints.add()
    group.locality.region, group.locality.zone, group.locality.sub_zone = region, zone, sub_zone
    address = group.lb_endpoints.add().endpoint.address.socket_address
    address.address, address.port_value = "10.0.0.1", 8080
    config = _config()
    _add(config, types.ENDPOINT, "c", assignment)
    [record] = proxy_config.endpoints(config).listed()
    assert record == {
        "endpoint": "10.0.0.1:8080",
        "status": "UNKNOWN",
        "cluster": "c",
        "locality": shown,
    }
    assert formatted(proxy_config.endpoints(config), "table").splitlines()[1].split()[-1] == (
        shown or "-"
    )


def test_one_node_id_with_two_identities_needs_one_picked() -> None:
    response = csds_pb2.ClientStatusResponse()
    for scope in ("spiffe://cluster.local/ns/a/sa/x", "spiffe://cluster.local/ns/b/sa/y"):
        response.config.append(_config("shared", scope))
    with pytest.raises(proxy_config.AmbiguousProxy, match="--identity"):
        proxy_config.select(response, "shared")
    picked = proxy_config.select(response, "shared", "spiffe://cluster.local/ns/b/sa/y")
    assert picked.client_scope.endswith("/ns/b/sa/y")
    with pytest.raises(proxy_config.ProxyNotFound):
        proxy_config.select(response, "shared", "spiffe://cluster.local/ns/c/sa/z")
    with pytest.raises(proxy_config.ProxyNotFound):
        proxy_config.select(response, "other")


def test_the_request_names_the_node_exactly_and_wants_contents() -> None:
    request = proxy_config.request_for("sidecar~10.0.0.1~a.b~b.svc.cluster.local")
    [matcher] = request.node_matchers
    assert matcher.node_id.exact == "sidecar~10.0.0.1~a.b~b.svc.cluster.local"
    assert not request.exclude_resource_contents


def test_times_are_utc_seconds() -> None:
    ca = new_ca("root", valid_for=datetime.timedelta(days=1))
    secret = secret_pb2.Secret(name="ROOTCA")
    pem = ca.cert.public_bytes(serialization.Encoding.PEM)
    secret.validation_context.trusted_ca.inline_bytes = pem
    config = _config()
    _add(config, types.SECRET, "ROOTCA", secret)
    [record] = proxy_config.secrets(config).listed()
    assert record["type"] == "CA"
    after = ca.cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert record["not_after"] == after
