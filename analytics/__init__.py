"""What fleetlens knows of the fleet: the store, the detectors and the reports people read.
errors.py holds the errors it raises, as one tree (AnalyticsError)."""
