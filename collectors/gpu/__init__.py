"""GPUs through NVML, or simulated ones: the data model, the two backends and the collector."""
