"""pilot: an asyncio xDS/SDS control plane for Envoy."""

import os

# pilot's children (the registry file's parser, the agent's Envoy) exec at once and never
# call gRPC. On uvloop (PILOT_EVENT_LOOP), which starts them with fork() rather than
# vfork(), gRPC's fork handlers would only write a line of their own to stderr each
# time. Read when gRPC is first imported, so it is set here, before pilot imports gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# Names are resolved by the system's resolver (getaddrinfo: /etc/hosts, then DNS as
# nsswitch.conf says), not by gRPC's own DNS client (c-ares). Where the nameserver never
# answers (a pod whose DNS drops what it does not serve), c-ares waits ~11 s for the AAAA
# answer of a name the hosts file already gives (pilot's Service), past the CA call's
# deadline: a sidecar's first certificate failed and came ~12 s later. Also read when
# gRPC is first imported, and inherited by the agent's Envoy (whose gRPC client reads it).
os.environ.setdefault("GRPC_DNS_RESOLVER", "native")
