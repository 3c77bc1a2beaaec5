"""From anomalies to people and actions: alert rules and lifecycle, receivers, silences, drains."""
