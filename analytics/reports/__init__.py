"""What people read off the store: the dashboards' read models and postmortem reports, aggregated in SQL."""
