"""What runs on a VM or inside a training job: the exporter, its collectors, the step-time SDK and the step
record it writes, log parsers. Imports nothing else of fleetlens (the import contract in pyproject.toml).
errors.py holds the errors it raises, as one tree (CollectorError)."""
