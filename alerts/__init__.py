"""From anomalies to people and actions: alert rules and lifecycle, receivers, silences, drains.
errors.py holds the errors it raises, as one tree (AlertsError)."""
