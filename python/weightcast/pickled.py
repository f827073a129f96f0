"""The pickled form of update_weights_from_tensor, read only when the engine opted in.

SGLang and Miles send `serialized_named_tensors`: one base64 entry per engine TP rank (rank i reads
entry i), each torch's multiprocessing pickle (ForkingPickler) of either
  - load_format "flattened_bucket": {"flattened_tensor": T, "metadata": [FlattenedTensorMetadata
    (name, shape, dtype, start_idx, end_idx, numel)]}: T is the tensors' bytes, one after another
    (`flatten().view(uint8)` in the multi-dtype form, where the indices are bytes; the tensors'
    own dtype in the older one-dtype form, where they count elements), or
  - no load_format (or "direct"): a list of (name, tensor) pairs, or a dict of them (SGLang's
    LoRA entries).
(Upstream: sglang python/sglang/srt/managers/io_struct.py @001067ff, UpdateWeightsFromTensorReqInput;
python/sglang/srt/weight_sync/tensor_bucket.py @07e90009 for the one-dtype form.)

Unpickling runs code: a payload can do whatever the engine's user can. So it is read only when the
engine was started with WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1, as vLLM reads its pickled IPC
handles only with VLLM_ALLOW_INSECURE_SERIALIZATION=1; otherwise the request is a 400 naming the
flag. Even opted in, the unpickler resolves only torch's tensor and storage rebuilders, the
metadata record and a few builtins (SGLang's own receiver keeps an allow-list too): anything else
is refused by name. The allow-list narrows what a payload can name; it is not a sandbox (a storage
pickled by value is rebuilt through torch.load, itself an unpickler): the opt-in is the boundary. CPU tensors must
be pickled so an unrelated process can open them: torch's "file_system" sharing strategy, or a
plain pickle that carries the bytes; the default "file_descriptor" strategy hands descriptors only
to the sender's own children.

weightcast's own form (load_format "weightcast_segment", docs/colocated.md) needs none of this.
"""

import base64
import binascii
import io
import json
import os
import pickle
from types import SimpleNamespace

OPT_IN = "WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION"


class PickledFormError(ValueError):
    """The request is refused (HTTP 400): `status` says so to the engine's front."""

    status = 400


def allowed():
    """Whether this process opted in (the variable holds a non-zero integer, as vLLM reads its own)."""
    value = os.environ.get(OPT_IN, "0").strip() or "0"
    try:
        return int(value) != 0
    except ValueError:
        return False


def refusal():
    return (
        "serialized_named_tensors: torch-pickled tensors, and unpickling runs code; this engine "
        f"reads them only when started with {OPT_IN}=1 (as vLLM needs "
        'VLLM_ALLOW_INSECURE_SERIALIZATION=1). Or send load_format "weightcast_segment" with a '
        "manifest and a segment handle (docs/colocated.md)"
    )


def check(body):
    """Refuses a pickled body (PickledFormError) unless opted in, and checks its shape."""
    if not allowed():
        raise PickledFormError(refusal())
    entries = body.get("serialized_named_tensors")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, str) for e in entries):
        raise PickledFormError("serialized_named_tensors: must be a non-empty list of base64 strings")
    if body.get("load_format") not in (None, "direct", "flattened_bucket"):
        raise PickledFormError(
            f"load_format: '{body.get('load_format')}' cannot be read with serialized_named_tensors; "
            'this engine reads "flattened_bucket" or none (a list of (name, tensor) pairs)'
        )


class _Metadata(SimpleNamespace):
    """What a FlattenedTensorMetadata unpickles to here, whichever module the sender used."""


_ALLOWED = {
    ("builtins", n)
    for n in ("list", "dict", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bytearray")
} | {("collections", "OrderedDict"), ("types", "SimpleNamespace")}
_TORCH_PREFIXES = ("torch._utils", "torch.storage", "torch.multiprocessing.reductions", "torch._tensor")


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name == "FlattenedTensorMetadata":
            return _Metadata
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and (name in ("Size", "Tensor") or name.endswith("Storage") or _is_dtype(name)):
            return super().find_class(module, name)
        if module.startswith(_TORCH_PREFIXES) and (name.startswith("_rebuild") or name.startswith("rebuild")):
            return super().find_class(module, name)
        if module.startswith(_TORCH_PREFIXES) and name in (
            "_load_from_bytes",
            "UntypedStorage",
            "TypedStorage",
        ):
            return super().find_class(module, name)
        if module.startswith("multiprocessing"):
            raise PickledFormError(
                f"serialized_named_tensors: refers to {module}.{name}: torch's file_descriptor sharing "
                "strategy, whose descriptors reach only the sender's own children; pickle CPU tensors "
                'with torch.multiprocessing.set_sharing_strategy("file_system")'
            )
        raise PickledFormError(
            f"serialized_named_tensors: refers to {module}.{name}, which this engine does not load"
        )


def _is_dtype(name):
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _load(entry):
    try:
        raw = base64.b64decode(entry, validate=True)
    except (binascii.Error, ValueError) as e:
        raise PickledFormError(f"serialized_named_tensors: an entry is not base64 ({e})") from None
    try:
        return _Unpickler(io.BytesIO(raw)).load()
    except PickledFormError:
        raise
    except Exception as e:
        raise PickledFormError(
            f"serialized_named_tensors: the entry does not unpickle ({type(e).__name__}: {e})"
        ) from None


def _flattened(obj):
    """(manifest, uint8 tensor) of a flattened bucket."""
    import torch

    if not isinstance(obj, dict) or not isinstance(obj.get("flattened_tensor"), torch.Tensor):
        raise PickledFormError(
            'load_format "flattened_bucket": the entry must hold {flattened_tensor, metadata}'
        )
    flat, metadata = obj["flattened_tensor"].detach().cpu().contiguous().view(-1), obj.get("metadata")
    if not isinstance(metadata, list) or not metadata:
        raise PickledFormError('load_format "flattened_bucket": metadata must be a non-empty list')
    scale = flat.element_size()  # the one-dtype form counts elements of the flattened tensor
    manifest = []
    for i, m in enumerate(metadata):
        try:
            name, shape, dtype = str(m.name), [int(d) for d in m.shape], m.dtype
            start, end = int(m.start_idx) * scale, int(m.end_idx) * scale
        except (AttributeError, TypeError, ValueError):
            raise PickledFormError(f"metadata[{i}]: needs name, shape, dtype, start_idx, end_idx") from None
        if not isinstance(dtype, torch.dtype):
            raise PickledFormError(f"metadata[{i}] ('{name}'): dtype is not a torch dtype")
        if flat.dtype != torch.uint8 and dtype != flat.dtype:
            raise PickledFormError(
                f"metadata[{i}] ('{name}'): {_dtype_name(dtype)} in a {_dtype_name(flat.dtype)} bucket; "
                "send the multi-dtype form (flatten().view(torch.uint8))"
            )
        numel = 1
        for d in shape:
            numel *= d
        if end - start != numel * torch.empty(0, dtype=dtype).element_size():
            raise PickledFormError(
                f"metadata[{i}] ('{name}'): bytes {start}..{end} do not hold shape {shape} of {_dtype_name(dtype)}"
            )
        manifest.append({"name": name, "dtype": _dtype_name(dtype), "shape": shape, "offset": start})
    return manifest, flat.view(torch.uint8)


def _pairs(obj):
    """(manifest, uint8 tensor) of a list of (name, tensor) pairs: one copy into one buffer."""
    import torch

    if isinstance(obj, dict):  # SGLang's LoRA entries: {name: tensor}
        obj = list(obj.items())
    if not isinstance(obj, (list, tuple)) or not obj:
        raise PickledFormError(
            "serialized_named_tensors: the entry must hold a list of (name, tensor) pairs or a dict of them"
        )
    manifest, parts, offset = [], [], 0
    for i, pair in enumerate(obj):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[1], torch.Tensor)):
            raise PickledFormError(f"serialized_named_tensors: pair {i} is not (name, tensor)")
        name, t = str(pair[0]), pair[1].detach().cpu().contiguous()
        manifest.append(
            {"name": name, "dtype": _dtype_name(t.dtype), "shape": list(t.shape), "offset": offset}
        )
        parts.append(t.view(-1).view(torch.uint8))
        offset += parts[-1].numel()
    return manifest, torch.cat(parts)


def ipc_refusal():
    return (
        "update_info.ipc_handles_pickled: pickled (function, args) handles, and unpickling runs "
        f"code; this engine reads them only when started with {OPT_IN}=1 (vLLM itself needs "
        "VLLM_ALLOW_INSECURE_SERIALIZATION=1)"
    )


def device_key():
    """The key this process's handles are filed under in vLLM's ipc shape: the physical GPU's UUID
    on a CUDA device (as vLLM's ipc backend reads them), "cpu" for a CPU engine."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    return "cpu"


def decode_ipc(info, key=None):
    """vLLM's ipc update_info (names, dtype_names, shapes, ipc_handles_pickled: base64 of a pickled
    list, per tensor {device key: (rebuild function, args)}) as (JSON body for
    Receiver.receive_local, uint8 tensor). Needs the opt-in; raises PickledFormError (400)."""
    import torch

    if not allowed():
        raise PickledFormError(ipc_refusal())
    if info.get("ipc_handles") is not None:
        raise PickledFormError(
            "update_info.ipc_handles: (function, args) pairs cannot travel in JSON; over HTTP send "
            "ipc_handles_pickled (base64 of their pickle), as vLLM's own http mode does"
        )
    names, dtypes, shapes = info["names"], info["dtype_names"], info["shapes"]
    handles = _load(info.get("ipc_handles_pickled") or "")
    if not isinstance(handles, list) or len(handles) != len(names):
        raise PickledFormError(
            f"update_info.ipc_handles_pickled: must hold one handle per name ({len(names)})"
        )
    key = key or device_key()
    pairs = []
    for i, (name, dtype, shape, handle) in enumerate(zip(names, dtypes, shapes, handles)):
        if not isinstance(handle, dict) or key not in handle:
            held = list(handle) if isinstance(handle, dict) else type(handle).__name__
            raise PickledFormError(
                f"ipc_handles[{i}] ('{name}'): no handle for this device '{key}' (has {held})"
            )
        try:
            func, args = handle[key]
            args = list(args)
            if getattr(func, "__name__", "") == "rebuild_cuda_tensor":
                args[6] = torch.cuda.current_device()  # the device index as this process counts
            t = func(*args)
        except PickledFormError:
            raise
        except Exception as e:
            raise PickledFormError(
                f"ipc_handles[{i}] ('{name}'): does not open ({type(e).__name__}: {e})"
            ) from None
        if not isinstance(t, torch.Tensor) or _dtype_name(t.dtype) != dtype or list(t.shape) != list(shape):
            got = (
                f"{_dtype_name(t.dtype)} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            )
            raise PickledFormError(
                f"ipc_handles[{i}] ('{name}'): opens as {got}, update_info says {dtype} {shape}"
            )
        pairs.append((name, t))
    return _local_body(info, *_pairs(pairs))


def decode(body, tp_rank):
    """The bucket TP rank `tp_rank` reads: (JSON body for Receiver.receive_local, uint8 tensor).
    Raises PickledFormError (400) for a request it cannot read, opted in or not."""
    check(body)
    entries = body["serialized_named_tensors"]
    if tp_rank >= len(entries):
        raise PickledFormError(
            f"serialized_named_tensors: {len(entries)} entries for an engine whose TP rank {tp_rank} reads entry {tp_rank}"
        )
    obj = _load(entries[tp_rank])
    return _local_body(
        body, *(_flattened(obj) if body.get("load_format") == "flattened_bucket" else _pairs(obj))
    )


def _local_body(request, manifest, flat):
    """(JSON body for Receiver.receive_local, uint8 tensor): the manifest and the request's
    session fields."""
    keep = ("selector", "session_id", "weight_version", "flush_cache", "abort_all_requests")
    local = {k: request[k] for k in keep if request.get(k) is not None}
    local["manifest"] = manifest
    return json.dumps(local), flat
