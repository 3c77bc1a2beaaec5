"""fleetlens alerts (filled in by later issues)."""
