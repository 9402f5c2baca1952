"""A sidecar's inbound side is made of its own namespace's services, never another's.

An EndpointSlice of another namespace naming a pod's address (a selector-less
Service anyone with a namespace can write) must not add ports to that pod's
inbound listener nor change the protocol of one it has: in Istio a proxy's
inbound side comes from the services selecting its pod, which are of its own
namespace. The pipeline and generators are the real ones (tests/unit/inbound_mesh).
"""

from __future__ import annotations

from tests.unit.inbound_mesh import (
    chains,
    endpoints,
    inbound_clusters,
    mesh,
    reviews,
    sidecar,
    svc,
)

POD_IP = "10.1.0.1"


def test_a_slice_of_another_namespace_at_a_pods_address_changes_nothing_it_reads() -> None:
    with mesh() as m:
        reviews(m, [POD_IP])
        m.flush()
        pod = m.connect(sidecar(POD_IP, identity="spiffe://cluster.local/ns/shop/sa/reviews"))
        before = (chains(pod), inbound_clusters(pod), pod.held["lds"]["virtualInbound"])
        # Namespace `aaa` sorts before `shop`: its ports would come first, and win 8080.
        m.updater.upsert_service(svc("squat", ("tcp-x", 80), ("tcp-more", 7777), namespace="aaa"))
        m.updater.upsert_endpoints(
            endpoints("squat", [POD_IP], ("tcp-x", 8080), ("tcp-more", 7777), namespace="aaa")
        )
        m.flush()
        m.take(pod)
        after = (chains(pod), inbound_clusters(pod), pod.held["lds"]["virtualInbound"])
        assert "inbound|7777||-mtls" not in after[0], "another namespace added a port"
        assert after == before, "8080 stays HTTP, as reviews (shop) says"
