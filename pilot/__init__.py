"""pilot: an asyncio xDS/SDS control plane for Envoy."""
