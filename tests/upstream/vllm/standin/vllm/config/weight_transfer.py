"""Stand-in of vllm/config/weight_transfer.py (upstream: a pydantic dataclass).

backend: Literal["nccl", "ipc"] in 0.16 (v0.16 docs; Literal["nccl"] @6ef35eee), a free string
(Literal[...] | str) from the 0.22.1/0.23 docs on. Validation refuses another name at
construction, as pydantic does (its ValidationError is a ValueError).
"""

from dataclasses import dataclass

from .._matrix import VERSION

KNOWN = ("nccl", "ipc")


@dataclass
class WeightTransferConfig:
    backend: str = "nccl"

    def __post_init__(self):
        if not isinstance(self.backend, str):
            raise ValueError(
                f"1 validation error for WeightTransferConfig\nbackend: Input should be a string "
                f"[input_value={self.backend!r}]"
            )
        if not VERSION.free_backend and self.backend not in KNOWN:
            raise ValueError(
                "1 validation error for WeightTransferConfig\nbackend: Input should be 'nccl' or "
                f"'ipc' [type=literal_error, input_value={self.backend!r}]"
            )
