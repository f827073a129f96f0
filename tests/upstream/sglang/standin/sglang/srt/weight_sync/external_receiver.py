"""Stand-in of sgl-project/sglang python/sglang/srt/weight_sync/external_receiver.py @fd623da6.

Reproduced: ``WeightUpdateReceiverContext`` (frozen, keyword-only: model, device, tp_rank,
tp_size, group_name, master_address, master_port, world_size, rank_offset, init_payload=None);
``build_weight_update_receiver(path, allowed, context)``: a path not in the
``--weight-update-receivers`` allowlist is refused before import ("... is not listed in
--weight-update-receivers"); the factory is imported and called with the context; an object
without callable receive(payload) and destroy() is destroyed (when it can be) and refused with
a TypeError. Present only in the external-receivers cell.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from sglang.cells import CELL, require
from sglang.srt.utils import dynamic_import

require(CELL.external_receivers, __name__)


@dataclass(frozen=True, kw_only=True)
class WeightUpdateReceiverContext:
    model: Any
    device: Any
    tp_rank: int
    tp_size: int
    group_name: str
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int
    init_payload: Optional[Dict[str, Any]] = None


def build_weight_update_receiver(path, allowed, context):
    if path not in (allowed or ()):
        raise ValueError(f"receiver {path!r} is not listed in --weight-update-receivers")
    receiver = dynamic_import(path)(context)
    if not callable(getattr(receiver, "receive", None)) or not callable(getattr(receiver, "destroy", None)):
        error = TypeError(
            f"receiver factory {path!r} must return an object with receive(payload) and destroy()"
        )
        destroy = getattr(receiver, "destroy", None)
        if callable(destroy):
            try:
                destroy()
            except Exception as destroy_error:
                raise error from destroy_error
        raise error
    return receiver
