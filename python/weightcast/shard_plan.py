"""Shard plans from a model's own loader (docs/sharding.md).

``record_plan(model, tensors)`` runs ``model.load_weights`` once on placeholder tensors and records
what the loader keeps of each one: the ``narrow(dim, offset, length)`` it copies from (nested
narrows compose), the whole tensor (replicated), or nothing (absent, e.g. an expert another EP
rank holds). That is how an engine can announce its plan without a hand-written table; the
result has the JSON shape of sync/model/shard_plan.h, and ``hand_written_plan`` gives the C++
rules for comparison. Placeholders are created one at a time, so recording holds at most one
full tensor besides the model. ``record_live_plan`` records from a model that is serving: its
parameters and the placeholders live on the meta device for the recording (as vLLM's layerwise
reload keeps parameters between its two calls), so nothing is allocated and no weight changes.

``sliced_pairs`` is the other direction, for a rank that receives only its slices: each slice goes
to ``load_weights`` as ``as_full(slice, full_shape, entry)``, which stands in for the full tensor
(its shape, and views of its bytes for the narrows inside the slice) and raises, naming the
tensor, on any use that would read bytes the rank does not hold.
"""

import json
import logging

import torch

from . import _weightcast


class _Traced(torch.Tensor):
    """A full tensor (or a narrow of one) that remembers which HF tensor and range it is."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.narrow, torch.narrow):
            src, dim, start, length = (list(args) + [kwargs.get(k) for k in ("dim", "start", "length")])[:4]
            with torch._C.DisableTorchFunction():
                out = torch.Tensor.narrow(src.as_subclass(torch.Tensor), dim, start, length)
            out = out.as_subclass(_Traced)
            out._wc = src._wc.narrowed(int(dim), int(start), int(length))
            return out
        if func is torch.Tensor.copy_ and len(args) > 1 and isinstance(args[1], _Traced):
            args[1]._wc.record()
        plain = [a.as_subclass(torch.Tensor) if isinstance(a, _Traced) else a for a in args]
        with torch._C.DisableTorchFunction():
            return func(*plain, **kwargs)


class _Origin:
    def __init__(self, name, shape, plan, dim=None, offset=0, length=None):
        self.name, self.shape, self.plan = name, shape, plan
        self.dim, self.offset, self.length = dim, offset, length

    def narrowed(self, dim, start, length):
        if self.dim is not None and dim != self.dim:
            raise ValueError(f"tensor '{self.name}': narrowed along dims {self.dim} and {dim}")
        return _Origin(self.name, self.shape, self.plan, dim, self.offset + start, length)

    def record(self):
        whole = self.dim is None or (self.offset == 0 and self.length == self.shape[self.dim])
        entry = "replicated" if whole else {"dim": self.dim, "offset": self.offset, "length": self.length}
        if self.plan.setdefault(self.name, entry) != entry:
            raise ValueError(f"tensor '{self.name}': loaded as {self.plan[self.name]} and as {entry}")


def record_plan(model, tensors, device="cpu"):
    """The plan ``model.load_weights`` follows for ``tensors`` ([(name, shape, dtype)]): a dict
    {"tensors": {name: {"dim", "offset", "length"} | "replicated" | "absent"}}. Placeholders are
    made on `device`."""
    plan = {}

    def placeholders():
        for name, shape, dtype in tensors:
            t = torch.zeros(shape, dtype=dtype, device=device).as_subclass(_Traced)
            t._wc = _Origin(name, list(shape), plan)
            yield name, t

    with torch.no_grad():
        model.load_weights(placeholders())
    return {"tensors": {name: plan.get(name, "absent") for name, _, _ in tensors}}


def record_live_plan(model, tensors):
    """``record_plan`` on a model that serves: while its ``load_weights`` runs on meta
    placeholders, every module's parameters are meta stand-ins of the same class, shape and
    attributes (a loader's ``weight_loader`` included), put back afterwards (on failure too). The
    recording allocates nothing, and a loader that reaches a real parameter some other way fails
    (a meta tensor cannot be copied out) instead of writing into it."""
    held = []
    try:
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                stand_in = type(p).__new__(type(p), torch.empty_like(p.data, device="meta"))
                stand_in.__dict__.update(p.__dict__)
                held.append((module, name, p))
                module._parameters[name] = stand_in
        return record_plan(model, tensors, device="meta")
    finally:
        for module, name, p in held:
            module._parameters[name] = p


class _Full(torch.Tensor):
    """A slice of an HF tensor standing in for the whole of it (``as_full``)."""

    def __repr__(self):
        return f"as_full({self._wc.name!r}, {self._wc.shape}, {self._wc.entry()})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        part = next(a._wc for a in _flat(args, kwargs) if isinstance(a, _Full))
        if func in _FULL_SHAPE:  # property getters come as Tensor.<property>.__get__
            return _FULL_SHAPE[func](torch.Size(part.shape), *args[1:], **kwargs)
        if func in _SAME_AS_SLICE:
            return func(part.data, *args[1:], **kwargs)
        if func in (torch.Tensor.narrow, torch.narrow):
            a = dict(zip(("input", "dim", "start", "length"), args), **kwargs)
            return part.narrow(int(a["dim"]), int(a["start"]), int(a["length"]))
        raise ValueError(
            f"tensor '{part.name}': {_op_name(func)} of it would read bytes this rank does not hold "
            f"(only {part.entry()} of shape {part.shape}); a loader may only narrow it into that slice"
        )


# What the full tensor reports about itself: its shape, and what it shares with the slice.
_FULL_SHAPE = {
    torch.Tensor.shape.__get__: lambda s: s,
    torch.Tensor.size: lambda s, dim=None: s if dim is None else s[dim],
    torch.Tensor.dim: len,
    torch.Tensor.ndim.__get__: len,
    torch.Tensor.numel: lambda s: s.numel(),
    torch.Tensor.__len__: lambda s: s[0],
}
_SAME_AS_SLICE = {
    torch.Tensor.dtype.__get__,
    torch.Tensor.device.__get__,
    torch.Tensor.layout.__get__,
    torch.Tensor.is_cuda.__get__,
    torch.Tensor.requires_grad.__get__,
    torch.Tensor.element_size,
}


def _flat(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        yield from a if isinstance(a, (list, tuple)) else [a]


def _op_name(func):
    if getattr(func, "__name__", "") == "__get__":
        return func.__self__.__name__  # a property: the getter of its descriptor
    return getattr(func, "__name__", repr(func))


class _Part:
    """Which slice of the full tensor ``name`` (``shape``) the plain tensor ``data`` is: ``dim``
    ``[offset, offset + data.shape[dim])``."""

    def __init__(self, name, shape, dim, offset, data):
        self.name, self.shape, self.dim, self.offset, self.data = name, shape, dim, offset, data
        self.length = data.shape[dim]

    def entry(self):
        return {"dim": self.dim, "offset": self.offset, "length": self.length}

    def narrow(self, dim, start, length):
        """A plain view of the slice's bytes where [start, start + length) lies inside it; where
        it covers only part of it, a narrower stand-in (whose own narrows compose)."""
        dim, size = dim % len(self.shape), self.shape[dim]
        start += size if start < 0 else 0
        if dim != self.dim:
            raise ValueError(
                f"tensor '{self.name}': narrowed along dim {dim}, but this rank holds only {self.entry()}"
            )
        if start < 0 or length < 0 or start + length > size:
            raise ValueError(
                f"tensor '{self.name}': narrow({dim}, {start}, {length}) is outside its size {size}"
            )
        end = self.offset + self.length
        if self.offset <= start and start + length <= end:
            return self.data.narrow(dim, start - self.offset, length)
        lo, hi = max(start, self.offset), min(start + length, end)
        if lo >= hi:
            raise ValueError(
                f"tensor '{self.name}': narrow({dim}, {start}, {length}) reads none of this rank's "
                f"slice {self.entry()}"
            )
        shape = self.shape[:dim] + [length] + self.shape[dim + 1 :]
        return _stand_in(
            _Part(self.name, shape, dim, lo - start, self.data.narrow(dim, lo - self.offset, hi - lo))
        )


def _stand_in(part):
    out = part.data.as_subclass(_Full)
    out._wc = part
    return out


def as_full(slice_tensor, full_shape, entry, name="?"):
    """``slice_tensor``, this rank's part ``entry`` (a plan entry) of the HF tensor ``name`` of
    shape ``full_shape``, as that full tensor for a loader (``model.load_weights``) that narrows
    full tensors itself. It reports the full ``shape``, ``size()``, ``dim()`` and ``numel()`` and
    the slice's ``dtype``; ``narrow`` (the method or ``torch.narrow``; nested narrows compose)
    gives a plain view of the slice's bytes where the range lies inside the slice. Any other use
    (``copy_`` from it, a view, reshape or index of it, a narrow outside the slice or along
    another dim) raises ValueError naming the tensor: it never reads bytes the rank lacks. A
    "replicated" entry (or a slice that is the whole tensor) gives ``slice_tensor`` as a plain
    tensor; "absent" raises."""
    full_shape = [int(n) for n in full_shape]
    if entry == "absent":
        raise ValueError(f"tensor '{name}': absent from this rank's plan, so it has no slice to load")
    if not isinstance(slice_tensor, torch.Tensor):
        raise ValueError(f"tensor '{name}': {type(slice_tensor).__name__} is not a tensor")
    plain = slice_tensor if type(slice_tensor) is torch.Tensor else slice_tensor.as_subclass(torch.Tensor)
    want = full_shape
    if entry != "replicated":
        dim, offset, length = entry["dim"], entry["offset"], entry["length"]
        if not 0 <= dim < len(full_shape) or offset < 0 or length < 0 or offset + length > full_shape[dim]:
            raise ValueError(f"tensor '{name}': slice {entry} falls outside its shape {full_shape}")
        want = full_shape[:dim] + [length] + full_shape[dim + 1 :]
    if list(plain.shape) != want:
        raise ValueError(
            f"tensor '{name}': slice of shape {list(plain.shape)}, but its entry {entry} of shape "
            f"{full_shape} has shape {want}"
        )
    if want == full_shape:
        return plain
    return _stand_in(_Part(name, full_shape, dim, offset, plain))


def sliced_pairs(pairs, plan, full_shapes):
    """``pairs`` ((HF name, this rank's slice of it)) as ``model.load_weights`` takes them, by
    this rank's ``plan`` ({"tensors": {name: entry}}) and ``full_shapes`` ({name: full shape},
    e.g. ``tensor_shapes(spec)``): each slice ``as_full`` of its tensor; replicated tensors, and
    tensors that arrive whole (from a trainer that does not shard, ``--shard off``), unchanged.
    Raises ValueError naming a tensor that is absent from the rank or missing from the plan or
    the shapes. Lazy, one pair at a time, like the pairs it maps."""
    entries = plan["tensors"]
    for name, t in pairs:
        entry = entries.get(name)
        if entry is None:
            raise ValueError(f"tensor '{name}': not in this rank's shard plan")
        if name not in full_shapes:
            raise ValueError(f"tensor '{name}': no full shape given for it")
        if entry == "replicated" or list(t.shape) == list(full_shapes[name]):
            yield name, t
            continue
        yield name, as_full(t, full_shapes[name], entry, name=name)


def hand_written_plan(spec, runner, tp_size, tp_rank, ep_size=1, placement="linear"):
    """The C++ tensor-parallel rules (sync/model/tensor_parallel_plan.h) for one rank."""
    text = _weightcast._tensor_parallel_plan(json.dumps(spec), runner, tp_size, tp_rank, ep_size, placement)
    return json.loads(text)


def tensor_shapes(spec, runner="target"):
    """{HF name: full shape} of the tensors of ``runner`` of the model an HF config dict ``spec``
    describes (the C++ model rules, sync/model/model.h): what an engine's HF config says its
    weights are, e.g. to check an adapter's A and B against them."""
    return {k: list(v) for k, v in _weightcast._tensor_shapes(json.dumps(spec), runner).items()}


def config_shape_of(get_config):
    """A target runner's ``shape_of`` (weightcast.Runner) from the model's HF config:
    ``get_config()`` returns it (a PretrainedConfig, or any object or dict with its keys) or
    None; the shapes are read once, on first use. None for a weight the config does not imply,
    or when the model rules cannot read the config (logged)."""
    shapes = None

    def shape_of(name):
        nonlocal shapes
        if shapes is None:
            shapes = _config_shapes(get_config())
        return shapes.get(name)

    return shape_of


def _config_dict(config):
    """An HF config (a PretrainedConfig, or any object or dict with its keys) as a dict."""
    spec = config.to_dict() if hasattr(config, "to_dict") else config
    if spec is not None and not isinstance(spec, dict):
        spec = vars(spec)
    return dict(spec) if spec else {}


def record_config_plan(model, config):
    """(plan, full shapes) of a serving engine rank whose HF config is `config`: the model's
    ``load_weights`` recorded on meta stand-ins (``record_live_plan``, no weight touched) over the
    tensors the config implies, in the model's dtype, and the draft's tensors whole. Tensors the
    config does not imply are not in the plan: the trainer sends them whole. Raises ValueError
    when the config implies no tensors, or whatever the loader raises on meta tensors."""
    spec = _config_dict(config)
    shapes = _config_shapes(spec)
    if not shapes:
        raise ValueError("the HF config implies no weight shapes")
    dtype = next(model.parameters()).dtype
    plan = record_live_plan(model, [(name, tuple(shape), dtype) for name, shape in shapes.items()])
    draft = tensor_shapes(spec, "draft")
    plan["tensors"].update({name: "replicated" for name in draft})
    return plan, {**shapes, **draft}


def _config_shapes(config):
    spec = _config_dict(config)
    if not spec:
        return {}
    try:
        return tensor_shapes(spec)
    except Exception as e:
        logging.getLogger(__name__).warning("weightcast: no weight shapes from the HF config: %s", e)
        return {}


def validate_plans(spec, runner, plans):
    """Raises weightcast.Error naming the tensor unless the ranks' plans cover every tensor of
    ``runner`` without partial overlap (sync/model/shard_plan.h)."""
    _weightcast._validate_shard_plans(json.dumps(spec), runner, [json.dumps(p) for p in plans])
