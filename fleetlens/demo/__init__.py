"""`fleetlens demo`: the whole platform on one machine, each part its own process (see demo.run)."""
