"""Stand-in of vllm/config/__init__.py: the config types the harness needs."""

from .weight_transfer import WeightTransferConfig  # noqa: F401
