"""Postmortem reports (report.py for now; split by layer in the next commit)."""
