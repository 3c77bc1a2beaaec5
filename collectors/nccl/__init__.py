"""NCCL_DEBUG=INFO logs (parse.py for now; split by layer in the next commit)."""
