"""fleetlens ui (filled in by later issues)."""
