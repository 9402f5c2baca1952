"""pilot: an asyncio xDS/SDS control plane for Envoy."""

import os

# pilot's children (the registry file's parser, the agent's Envoy) exec at once and never
# call gRPC. On uvloop (PILOT_EVENT_LOOP), which starts them with fork() rather than
# vfork(), gRPC's fork handlers would only write a line of their own to stderr each
# time. Read when gRPC is first imported, so it is set here, before pilot imports gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
