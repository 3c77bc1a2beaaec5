"""What fleetlens knows of the fleet: the store, the detectors and the reports people read."""
