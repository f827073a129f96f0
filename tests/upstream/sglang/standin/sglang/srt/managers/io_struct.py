"""Stand-in of sgl-project/sglang python/sglang/srt/managers/io_struct.py: the weight-update
request and answer types, in the cell's flavour.

- Before the msgspec migration (v0.5.x): ``@dataclass class X(BaseReq)``, fields as at the
  v0.5.x io_struct (UpdateWeightsFromDistributedReqInput: names, dtypes, shapes, group_name
  "weight_update_group", flush_cache True, abort_all_requests False, weight_version,
  load_format, torch_empty_cache False).
- After it (PR #28688; sglang-miles v0.5.16 and main): ``BaseReq(msgspec.Struct, tag=True,
  kw_only=True, array_like=True)`` subclasses, no ``__dict__`` (here msgspec_like.Struct).
  Sessions add BeginWeightUpdateReqInput(selector) / EndWeightUpdateReqInput and the update's
  ``selector`` (scheduler_components/weight_updater.py @00a2ca2e reads recv_req.selector).
- External receivers (@fd623da6): InitWeightsUpdateGroupReqInput.receiver /
  receiver_init_payload and UpdateWeightsFromDistributedReqInput.receiver_payload, all None by
  default.
"""

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Optional

from sglang.cells import CELL
from sglang.srt.msgspec_like import Struct
from sglang.srt.msgspec_like import asdict as msgspec_asdict

if CELL.msgspec:

    class BaseReq(Struct, tag=True, kw_only=True, array_like=True):
        rid: Optional[str] = None
        http_worker_ipc: Optional[str] = None

else:

    @dataclass
    class BaseReq:
        rid: Optional[str] = None
        http_worker_ipc: Optional[str] = None


_REQUIRED = object()


def _define(name, spec):
    """spec: [(field, default or _REQUIRED)] in order."""
    if CELL.msgspec:
        ns = {"__annotations__": {k: Any for k, _ in spec}, "__module__": __name__, "__qualname__": name}
        ns.update({k: v for k, v in spec if v is not _REQUIRED})
        return type(name, (BaseReq,), ns)
    # Dataclass fields after BaseReq's defaults need defaults too: SGLang's v0.5.x BaseReq
    # dataclasses use kw_only; make_dataclass takes the same.
    fields = [(k, Any) if v is _REQUIRED else (k, Any, field(default=v)) for k, v in spec]
    cls = make_dataclass(name, fields, bases=(BaseReq,), kw_only=True)
    cls.__module__ = __name__
    return cls


_answer = [("success", _REQUIRED), ("message", _REQUIRED)]
_init = [
    ("master_address", _REQUIRED),
    ("master_port", _REQUIRED),
    ("rank_offset", _REQUIRED),
    ("world_size", _REQUIRED),
    ("group_name", "weight_update_group"),
    ("backend", "nccl"),
]
_update = [
    ("names", _REQUIRED),
    ("dtypes", _REQUIRED),
    ("shapes", _REQUIRED),
    ("group_name", "weight_update_group"),
    ("flush_cache", True),
    ("abort_all_requests", False),
    ("weight_version", None),
    ("load_format", None),
    ("torch_empty_cache", False),
]
if CELL.manager:
    _update.append(("selector", "all"))
if CELL.external_receivers:
    _init += [("receiver", None), ("receiver_init_payload", None)]
    _update.append(("receiver_payload", None))

InitWeightsUpdateGroupReqInput = _define("InitWeightsUpdateGroupReqInput", _init)
InitWeightsUpdateGroupReqOutput = _define("InitWeightsUpdateGroupReqOutput", _answer)
DestroyWeightsUpdateGroupReqInput = _define(
    "DestroyWeightsUpdateGroupReqInput", [("group_name", "weight_update_group")]
)
DestroyWeightsUpdateGroupReqOutput = _define("DestroyWeightsUpdateGroupReqOutput", _answer)
UpdateWeightsFromDistributedReqInput = _define("UpdateWeightsFromDistributedReqInput", _update)
UpdateWeightsFromDistributedReqOutput = _define("UpdateWeightsFromDistributedReqOutput", _answer)
GetInternalStateReq = _define("GetInternalStateReq", [])
GetInternalStateReqOutput = _define("GetInternalStateReqOutput", [("internal_state", _REQUIRED)])
# UpdateWeightsFromTensorReqInput's fields and defaults as io_struct.py @001067ff (the per-TP-rank
# base64 entries, load_format None or "flattened_bucket"), with the selector the manager reads on
# main @00a2ca2e (v0.5.x has no selector: TpModelWorker loads the target).
UpdateWeightsFromTensorReqInput = _define(
    "UpdateWeightsFromTensorReqInput",
    [
        ("serialized_named_tensors", _REQUIRED),
        ("load_format", None),
        ("flush_cache", True),
        ("abort_all_requests", False),
        ("weight_version", None),
        ("torch_empty_cache", False),
    ]
    + ([("selector", "all")] if CELL.manager else []),
)
UpdateWeightsFromTensorReqOutput = _define("UpdateWeightsFromTensorReqOutput", _answer)
if CELL.manager:
    BeginWeightUpdateReqInput = _define("BeginWeightUpdateReqInput", [("selector", "all")])
    BeginWeightUpdateReqOutput = _define("BeginWeightUpdateReqOutput", _answer)
    EndWeightUpdateReqInput = _define("EndWeightUpdateReqInput", [])
    EndWeightUpdateReqOutput = _define("EndWeightUpdateReqOutput", _answer)

if CELL.lora:
    # The run-time LoRA requests as io_struct.py on sglang-miles @a0e1292f (identical at
    # sgl-project/sglang @00a2ca2e): each request's to_ref() names where its tensors come from
    # ("__distributed__", "__tensor__"); the three answers are LoRAUpdateOutput.
    def _to_ref(path):
        def to_ref(self):
            from sglang.srt.lora.lora_registry import LoRARef

            extra = {"lora_id": self.lora_id} if self.lora_id else {}
            return LoRARef(lora_name=self.lora_name, lora_path=path, pinned=self.pinned, **extra)

        return to_ref

    def _unload_ref(self):
        from sglang.srt.lora.lora_registry import LoRARef

        return LoRARef(lora_name=self.lora_name, lora_id=self.lora_id)

    def _lora(source, *tail):
        """The fields of a load request: name and config, where the tensors come from, then
        the shared ones, then `tail` (field order as upstream)."""
        shared = [("pinned", False), ("added_tokens_config", None), ("lora_id", None)]
        return [("lora_name", _REQUIRED), ("config_dict", _REQUIRED)] + source + shared + list(tail)

    _from_group = [("names", _REQUIRED), ("dtypes", _REQUIRED), ("shapes", _REQUIRED)]
    LoadLoRAAdapterFromDistributedReqInput = _define(
        "LoadLoRAAdapterFromDistributedReqInput",
        _lora(_from_group + [("group_name", "weight_update_group")], ("upsert", False)),
    )
    LoadLoRAAdapterFromDistributedReqInput.to_ref = _to_ref("__distributed__")
    LoadLoRAAdapterFromTensorsReqInput = _define(
        "LoadLoRAAdapterFromTensorsReqInput",
        _lora(
            [("serialized_named_tensors", _REQUIRED)],
            ("load_format", None),
            ("upsert", False),
            ("expected_checksums", None),
        ),
    )
    LoadLoRAAdapterFromTensorsReqInput.to_ref = _to_ref("__tensor__")
    UnloadLoRAAdapterReqInput = _define(
        "UnloadLoRAAdapterReqInput", [("lora_name", _REQUIRED), ("lora_id", None)]
    )
    UnloadLoRAAdapterReqInput.to_ref = _unload_ref
    LoRAUpdateOutput = _define(
        "LoRAUpdateOutput", [("success", _REQUIRED), ("error_message", None), ("loaded_adapters", None)]
    )
    LORA_ROUTES = {
        "/load_lora_adapter_from_distributed": "LoadLoRAAdapterFromDistributedReqInput",
        "/load_lora_adapter_from_tensors": "LoadLoRAAdapterFromTensorsReqInput",
        "/unload_lora_adapter": "UnloadLoRAAdapterReqInput",
    }
else:
    LORA_ROUTES = {}

# The HTTP front builds a request from a JSON body the way SGLang's FastAPI layer does: known
# fields taken, unknown ones dropped.
ROUTES = {
    "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
}
if CELL.manager:
    ROUTES.update(
        {
            "/begin_weight_update": "BeginWeightUpdateReqInput",
            "/end_weight_update": "EndWeightUpdateReqInput",
        }
    )


def from_json(cls, body):
    names = cls.__struct_fields__ if CELL.msgspec else [f for f in cls.__dataclass_fields__]
    return cls(**{k: v for k, v in (body or {}).items() if k in names})


def asdict(req):
    """A request's fields (the front's, to rebuild one with its lora_id)."""
    if CELL.msgspec:
        return msgspec_asdict(req)
    return {f: getattr(req, f) for f in req.__dataclass_fields__}
