"""fleetlens: the front door (CLI and configuration) that wires collectors, analytics, alerts and ui."""
