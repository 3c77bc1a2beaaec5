"""fleetlens analytics (filled in by later issues)."""
