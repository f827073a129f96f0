"""Stand-in of vllm/lora/request.py: ``LoRARequest(lora_name, lora_int_id, lora_path,
load_inplace)`` (upstream a msgspec Struct whose ``lora_path`` must not be empty; read at
vllm-project/vllm @8539e44c0b8f879c33114f237b54abc2cfcf69b9, ``load_inplace`` from PR #31326 as
the worker reads it at @bb1d76e5bfb6f2315f4414d1dc4a84f1e7b22e75)."""

from dataclasses import asdict, dataclass


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    load_inplace: bool = False

    def __post_init__(self):
        assert self.lora_path, "lora_path cannot be empty"

    def as_dict(self):
        return asdict(self)
