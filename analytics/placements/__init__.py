"""What runs where: each scheduler's answer read into analytics.store.records.Placement
(slurm: squeue --json)."""
