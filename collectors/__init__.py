"""What runs on a VM or feeds the hub: the exporter, its collectors, the step-time SDK, log parsers."""
