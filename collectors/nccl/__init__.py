"""NCCL_DEBUG=INFO logs: records, parsing, one verdict per rank, and the nccl_log collector."""
