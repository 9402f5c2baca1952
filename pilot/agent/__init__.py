"""`pilot agent` beside Envoy: the SDS agent, the bootstrap and the Envoy it starts, the
capture rules (`pilot agent iptables`), the status port and the SDS socket."""
