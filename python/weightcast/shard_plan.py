"""Shard plans from a model's own loader (docs/sharding.md).

``record_plan(model, tensors)`` runs ``model.load_weights`` once on placeholder tensors and records
what the loader keeps of each one: the ``narrow(dim, offset, length)`` it copies from (nested
narrows compose), the whole tensor (replicated), or nothing (absent, e.g. an expert another EP
rank holds). That is how an engine can announce its plan without a hand-written table; the
result has the JSON shape of sync/model/shard_plan.h, and ``hand_written_plan`` gives the C++
rules for comparison. Placeholders are created one at a time, so recording holds at most one
full tensor besides the model.
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


def record_plan(model, tensors):
    """The plan ``model.load_weights`` follows for ``tensors`` ([(name, shape, dtype)]): a dict
    {"tensors": {name: {"dim", "offset", "length"} | "replicated" | "absent"}}."""
    plan = {}

    def placeholders():
        for name, shape, dtype in tensors:
            t = torch.zeros(shape, dtype=dtype).as_subclass(_Traced)
            t._wc = _Origin(name, list(shape), plan)
            yield name, t

    with torch.no_grad():
        model.load_weights(placeholders())
    return {"tensors": {name: plan.get(name, "absent") for name, _, _ in tensors}}


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


def _config_shapes(config):
    spec = config.to_dict() if hasattr(config, "to_dict") else config
    if spec is not None and not isinstance(spec, dict):
        spec = vars(spec)
    if not spec:
        return {}
    try:
        return tensor_shapes(dict(spec))
    except Exception as e:
        logging.getLogger(__name__).warning("weightcast: no weight shapes from the HF config: %s", e)
        return {}


def validate_plans(spec, runner, plans):
    """Raises weightcast.Error naming the tensor unless the ranks' plans cover every tensor of
    ``runner`` without partial overlap (sync/model/shard_plan.h)."""
    _weightcast._validate_shard_plans(json.dumps(spec), runner, [json.dumps(p) for p in plans])
