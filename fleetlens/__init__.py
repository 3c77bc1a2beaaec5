"""fleetlens: the front door (CLI and configuration) that wires collectors, analytics, alerts and ui;
errors.py holds the errors it raises, as one tree (FleetlensError)."""
