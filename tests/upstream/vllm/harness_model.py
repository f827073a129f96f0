"""The harness's side of the stand-in engine: the model every worker loads (the small TP torch
model with fused qkv_proj / gate_up_proj and an EAGLE-style draft whose post-load processing is
a non-idempotent shuffle), and the test hooks the stand-in front runs on its workers
(POST /standin/call): a report of what each model holds, and injected faults.

Each worker starts from the generator's step-0 tensors (the trainer's `--seed`, WEIGHTCAST_
STANDIN_SEED), loaded and processed once as an engine's own load does; the processing counters
start at zero after that.
"""

import os
from types import SimpleNamespace

import torch

from weightcast import _weightcast

from weightcast.reference.model import DraftModel, Parallel, TargetModel, model_spec

PRESET = "tiny"


def generator_tensors(runner, seed, step):
    out = []
    for name, dtype, shape, raw in _weightcast._model_tensors(PRESET, runner, seed, step):
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)
        out.append((name, t))
    return out


def new_target(rank, tp):
    return TargetModel(model_spec(PRESET), Parallel(rank, tp))


class Drafter(torch.nn.Module):
    """The engine's draft model: a frozen EAGLE-style head (DraftModel, "draft.*", which no
    trainer round carries) and its own copy of lm_head.weight, the one tensor of a checkpoint
    stream it loads (every other name is skipped, as vLLM's MTP drafters skip what they do not
    hold). Post-load processing is the non-idempotent tiled shuffle, applied to the tensors
    loaded since the last processing (as layerwise reload processes what was reloaded): run on a
    tensor that was not reloaded, it leaves a layout the kernels misread."""

    def __init__(self):
        super().__init__()
        spec = model_spec(PRESET)
        self.head = DraftModel(spec)
        self.lm_head = torch.nn.Module()
        self.lm_head.weight = torch.nn.Parameter(
            torch.zeros(spec["vocab_size"], spec["hidden_size"], dtype=torch.bfloat16), requires_grad=False
        )
        self.pending = set()

    def load_weights(self, weights):
        loaded = []
        for name, tensor in weights:
            if name == "lm_head.weight":
                self.lm_head.weight.data.copy_(tensor)
            elif name.startswith("draft."):
                self.head.load_weights([(name, tensor)])
            else:
                continue
            self.pending.add(name)
            loaded.append(name)
        return loaded

    def process_weights_after_loading(self):
        if "lm_head.weight" in self.pending:
            self.head._layout(self.lm_head.weight.data, undo=False)
        if any(n.startswith("draft.") for n in self.pending):
            self.head.process_weights_after_loading()
        self.pending.clear()

    def logical(self):
        """What the draft's kernels read, layouts undone: {hf_name: tensor}."""
        lm_head = self.lm_head.weight.data.clone()
        self.head._layout(lm_head, undo=True)
        return {"lm_head.weight": lm_head, **self.head.hf_tensors()}


def draft_tensors(seed, step):
    """What the drafter holds after loading generator (seed, step): the frozen head stays at the
    engine's start (step 0 of the harness seed); lm_head.weight is the target's."""
    start = int(os.environ.get("WEIGHTCAST_STANDIN_SEED", "7"))
    out = dict(generator_tensors("draft", start, 0))
    out["lm_head.weight"] = dict(generator_tensors("target", seed, step))["lm_head.weight"]
    return out


def build(config, rank):
    """WEIGHTCAST_STANDIN_MODEL: the model runner of worker `rank`."""
    seed = int(os.environ.get("WEIGHTCAST_STANDIN_SEED", "7"))
    target = new_target(rank, config.parallel_config.tensor_parallel_size)
    target.load_weights(generator_tensors("target", seed, 0))
    target.standin_processed = 0
    drafter = None
    if config.speculative_config is not None:
        draft = Drafter()
        draft.load_weights(list(draft_tensors(seed, 0).items()))
        draft.process_weights_after_loading()
        draft.standin_processed = 0
        drafter = SimpleNamespace(model=draft)
    return SimpleNamespace(model=target, drafter=drafter)


# Test hooks, run in a worker as fn(worker, *args).


def report(worker, path):
    """Saves what the worker's models hold (target parameters, the draft's logical tensors) and
    answers the counters and the worker's update state."""
    runner = worker.model_runner
    saved = {"target": {n: p.detach().clone() for n, p in runner.model.named_parameters()}}
    models = {"target": runner.model}
    if runner.drafter is not None:
        saved["draft"] = runner.drafter.model.logical()
        models["draft"] = runner.drafter.model
    torch.save(saved, os.path.join(path, f"rank{worker.rank}.pt"))
    rank = getattr(worker, "_weightcast", None)
    return {
        "bytes_received": rank.receiver.bytes_received if rank is not None else 0,
        "processed": {k: getattr(m, "standin_processed", 0) for k, m in models.items()},
        "reloading": [k for k, m in models.items() if getattr(m, "standin_reloading", False)],
        "active": worker._weight_update_active,
        "adapters": _adapters(worker),
    }


def hexes(pairs):
    """{name: hex of the tensor's bytes} of (name, tensor) pairs."""
    return {n: t.contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex() for n, t in pairs}


def _adapters(worker):
    """{lora_name: {tensor name: hex of its bytes}} the worker's LoRA manager holds."""
    manager = getattr(worker, "_standin_lora", None)
    return {a["name"]: hexes(a["tensors"].items()) for a in (manager.adapters if manager else {}).values()}


def fault(worker, kind, way):
    """kind "bucket": the next bucket is received, then fails (as one whose digests do not match
    is refused once received); kind "load": the target's next load_weights raises before it
    changes anything. `way`: "backend" or "extension" (where the bucket fails)."""
    if kind == "bucket" and way == "backend":
        engine = worker.weight_transfer_engine
        real = engine.update_weights

        def update_then_fail(info):
            real(info)
            del engine.update_weights
            raise RuntimeError(f"injected failure after receiving bucket {info.get('sequence')}")

        engine.update_weights = update_then_fail
    elif kind == "bucket":
        real = worker.weightcast_update

        def update_then_fail(body):
            real(body)
            del worker.weightcast_update
            raise RuntimeError("injected failure after receiving a bucket")

        worker.weightcast_update = update_then_fail
    elif kind == "load":
        model = worker.model_runner.model
        real, armed = model.load_weights, [True]

        def refuse_once(weights):
            if armed:
                armed.clear()
                raise RuntimeError("injected load failure")
            return real(weights)

        model.load_weights = refuse_once
    else:
        raise ValueError(f"fault: unknown kind {kind!r}")
    return {"armed": kind}


class CollidingExtension:
    """A worker extension whose method collides with the worker's own (refused at start)."""

    def update_weights(self, update_info):
        return None
