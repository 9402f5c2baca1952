"""Workload identity: pilot's CA, caller authentication, the CA client, and SDS secrets."""
