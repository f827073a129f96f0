"""Stand-in of vllm/distributed/weight_transfer/__init__.py."""
