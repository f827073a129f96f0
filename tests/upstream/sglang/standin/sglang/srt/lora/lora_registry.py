"""Stand-in of sgl-project/sglang python/sglang/srt/lora/lora_registry.py as on the sglang-miles
branch (read @a0e1292f2bdb255ac758e95a9ba7748c2787e8b3, the merge of PR #30913 that added upsert):
the tokenizer side's record of which adapter name holds which ``lora_id``.

Reproduced: ``LoRARef(lora_id, lora_name, lora_path, pinned)`` with a fresh uuid4 id when none
is given; ``register_or_reuse(ref, upsert)`` (an upsert of a held name takes over its id, and
says it reused it); ``register`` / ``refresh``; ``unregister(name)`` raising ValueError "LoRA
with name ... does not exist. Loaded LoRAs: ..." for an unknown name. Reference counting of
running requests (``acquire``/``release``) is left out: the stand-in serves no generation.
"""

import uuid
from dataclasses import dataclass, field, replace
from typing import Optional


@dataclass(frozen=True)
class LoRARef:
    lora_name: str
    lora_path: Optional[str] = None
    pinned: bool = False
    lora_id: str = field(default_factory=lambda: uuid.uuid4().hex)


class LoRARegistry:
    def __init__(self):
        self._by_name = {}

    def register_or_reuse(self, ref, upsert=False):
        """(the ref to load under, whether it reuses a held adapter's id)."""
        held = self._by_name.get(ref.lora_name)
        if upsert and held is not None:
            return replace(ref, lora_id=held.lora_id), True
        return ref, False

    def register(self, ref):
        self._by_name[ref.lora_name] = ref

    def refresh(self, ref):
        self._by_name[ref.lora_name] = ref

    def unregister(self, lora_name):
        if lora_name not in self._by_name:
            raise ValueError(
                f"LoRA with name {lora_name} does not exist. Loaded LoRAs: {list(self._by_name)}"
            )
        return self._by_name.pop(lora_name)

    def loaded(self):
        return {name: ref.lora_path for name, ref in self._by_name.items()}
