"""Active health checks a node runs on itself (GPU, network, collective bandwidth), each returning
CheckResult rows for the hub's `checks` table and the Autopilot-compatible health metric."""
