"""weightcast inside SGLang: an ``sglang.srt.plugins`` entry point (``weightcast =
weightcast.sglang:register`` in the package metadata) that routes each TP worker's weight updates
through a weightcast Receiver, and a receiver factory (``weightcast.sglang.receiver``) for builds
with SGLang's external-receiver seam.

``register()`` runs in every SGLang process (``load_plugins()``) and picks the way in that the
build has (docs/engines.md, "Version matrix: SGLang"):

- ``receiver``: ``sglang/srt/weight_sync/external_receiver.py`` exists. Launch with
  ``--weight-update-receivers weightcast.sglang.receiver``; the trainer names it in the init
  request (``receiver``, ``receiver_init_payload`` {"backend"}) and sends each bucket as
  ``receiver_payload`` (our bucket body; names/dtypes/shapes of the request stay empty).
- ``weight_updater`` (main): REPLACE hooks on the model runner's ``WeightUpdater``
  ``init_weights_update_group / receive_weights_from_distributed / destroy_weights_update_group``,
  where the scheduler's calls really go; the group is ours from init on, so SGLang never receives
  into a group it does not have.
- ``model_runner`` (sglang-miles v0.5.16): the same three methods on ``ModelRunner``.
- ``tp_worker`` (v0.5.x before the scheduler's weight-updater manager): REPLACE hooks on
  ``TpModelWorker``'s per-worker methods (the tensor route too: the pickled entry read only
  with WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1); no sessions, each request commits on its own.

Where SGLang has sessions (``SchedulerWeightUpdaterManager.begin/end_weight_update``), AROUND hooks
scope a weightcast session to SGLang's: begin records the selector and the runners it covers
(target, draft), buckets are staged and verified, and end commits into every covered runner's
model before SGLang's own end runs its post-load processing on exactly those runners. The
receive hooks hand SGLang no tensors to load (nothing reaches a model before the commit). A failed
bucket or a destroyed group discards the round; end then answers ``success: false``. Where the
manager has ``update_weights_from_tensor`` (the colocated path Miles drives), a REPLACE hook reads
the pickled ``serialized_named_tensors`` only with WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1
(weightcast.pickled) and stages it in the same session.

Where SGLang has run-time LoRA from a weight-update group (sglang-miles:
``ModelRunner.load_lora_adapter_from_distributed``) or from tensors
(``TpModelWorker.load_lora_adapter_from_tensors``), REPLACE hooks receive the adapter in a
weightcast adapter session (docs/lora.md: target only, staged, checked against the base weights'
shapes from the model's HF config) and hand SGLang's LoRA manager the whole adapter only once
every tensor arrived and passed; a refused or broken load leaves what SGLang held. The pickled
entries of ``/load_lora_adapter_from_tensors`` are read only with the opt-in, as above. A load
while a session for ``draft`` or ``all`` is open is refused: adapters apply to the target.

The plug-in announces itself: an AFTER hook on the scheduler's ``get_internal_state`` (on the
``SchedulerInternalStateController`` where the build has it) adds a ``weightcast`` key
({"version", "receiver", "native_routes": false, "mode", "hooked"}) to each scheduler's internal
state; ``hooked`` lists only the hooks SGLang applied. Requests are read by their fields
(dataclasses before SGLang's msgspec migration, ``msgspec.Struct``s with no ``__dict__`` after).
"""

import dataclasses
import importlib
import importlib.util
import logging
import pkgutil

from . import __version__, pickled
from .engine_rank import EngineRank
from .receiver import Runner

logger = logging.getLogger(__name__)

WORKER = "sglang.srt.managers.tp_worker.TpModelWorker"
RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
UPDATER = "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater"
MANAGER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
SCHEDULER_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
CONTROLLER_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController.get_internal_state"
)
SEAM = "sglang.srt.weight_sync.external_receiver"
TENSOR_OUTPUT = "sglang.srt.managers.io_struct.UpdateWeightsFromTensorReqOutput"
LORA_OUTPUT = "sglang.srt.managers.io_struct.LoRAUpdateOutput"
LORA_DISTRIBUTED = f"{RUNNER}.load_lora_adapter_from_distributed"
LORA_TENSORS = f"{WORKER}.load_lora_adapter_from_tensors"
RECEIVER_FACTORY = "weightcast.sglang.receiver"
MINIMUM = (
    "SGLang v0.5.x with TpModelWorker.update_weights_from_distributed (sessions and the "
    "draft: sglang-miles v0.5.16 or main with SchedulerWeightUpdaterManager)"
)
GROUP_METHODS = ("init_weights_update_group", "destroy_weights_update_group")
REQUEST_INTERNALS = ("rid", "http_worker_ipc")


class _State:
    """This process's weightcast rank (SGLang runs one scheduler process per TP rank)."""

    def __init__(self):
        self.mode = None
        self.registered = []
        self.rank = None
        self.manager = None  # the SchedulerWeightUpdaterManager, seen at begin
        self.selector = None  # SGLang's open session, or None
        self.failure = None  # why the open round was discarded


_STATE = _State()


def _resolve(path):
    try:
        return pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError):
        return None


def _module_exists(name):
    try:
        return importlib.util.find_spec(name) is not None and importlib.import_module(name) is not None
    except ImportError:
        return False


def detect_mode():
    """The way into this SGLang build; RuntimeError naming the minimum version when none fits."""
    if _module_exists(SEAM):
        return "receiver"
    if _resolve(f"{UPDATER}.receive_weights_from_distributed") is not None:
        return "weight_updater"
    if _resolve(f"{RUNNER}.receive_weights_from_distributed") is not None:
        return "model_runner"
    if _resolve(f"{WORKER}.update_weights_from_distributed") is not None:
        return "tp_worker"
    version = getattr(importlib.import_module("sglang"), "__version__", "?")
    raise RuntimeError(
        f"weightcast.sglang: SGLang {version} has no weight-update path the plug-in "
        f"can take; it needs {MINIMUM}"
    )


def fields(req):
    """A request's fields as a dict, without None and SGLang's routing fields: dataclasses,
    msgspec Structs (``__struct_fields__``, no ``__dict__``) and plain objects alike."""
    if hasattr(type(req), "__struct_fields__"):
        names = type(req).__struct_fields__
    elif dataclasses.is_dataclass(req):
        names = [f.name for f in dataclasses.fields(req)]
    else:
        names = list(vars(req))
    out = {}
    for name in names:
        value = getattr(req, name, None)
        if value is not None and not name.startswith("_") and name not in REQUEST_INTERNALS:
            out[name] = value
    return out


def announce():
    """The `weightcast` key of /server_info (the torch reference engine answers the same)."""
    patched = _patched()
    hooked = [".".join(t.split(".")[-2:]) for t in _STATE.registered if t in patched]
    receiver = RECEIVER_FACTORY if _STATE.mode == "receiver" else "weightcast.Receiver"
    return {
        "version": __version__,
        "receiver": receiver,
        "native_routes": False,
        "mode": _STATE.mode,
        "hooked": hooked,
    }


def _patched():
    registry = _resolve("sglang.srt.plugins.hook_registry.HookRegistry")
    return set(getattr(registry, "_patched", ())) if registry is not None else set()


def _announce_state(result, *args, **kwargs):
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        state["weightcast"] = announce()
    return result


# --- the rank and its runners ---------------------------------------------------------------


def _covered_models(role):
    """The models SGLang's manager holds for `role` ("target" or "draft")."""
    manager = _STATE.manager
    if manager is None:
        return []
    return [runner.model for _, runner in manager.get_model_runners(role)]


def _runners(target_model):
    from .shard_plan import config_shape_of

    def load_target(pairs):
        target_model.load_weights(iter(pairs))

    def load_draft(pairs):
        models = _covered_models("draft")
        if not models:
            raise RuntimeError("this engine has no draft runner")
        pairs = list(pairs)
        for model in models:
            model.load_weights(iter(pairs))

    return [
        # An adapter's A and B are checked against the base shapes the model's HF config implies
        # (SGLang's models keep it as .config).
        Runner(
            "target", load_target, shape_of=config_shape_of(lambda: getattr(target_model, "config", None))
        ),
        Runner("draft", load_draft),
    ]


def _make_rank(model, tp_rank, tp_size, device=None):
    if _STATE.rank is None:
        _STATE.rank = EngineRank(
            runners=_runners(model), engine_rank=tp_rank, rank_count=tp_size, device=device
        )
    return _STATE.rank


def _device(obj):
    return getattr(obj, "gpu_id", None) if str(getattr(obj, "device", "cpu")).startswith("cuda") else None


def _session_begin():
    """Opens the weightcast session of SGLang's open one, at the round's first bucket."""
    rank = _STATE.rank
    if rank is None:
        raise RuntimeError("no weight-update group: call init_weights_update_group first")
    if _STATE.failure is not None:
        raise RuntimeError(f"this round was discarded ({_STATE.failure}); end it and begin again")
    if _STATE.selector is not None and not rank.receiver.in_session:
        rank.begin(_STATE.selector)


def _receive(body):
    rank = _STATE.rank
    _session_begin()
    try:
        if _STATE.selector is None:
            # No SGLang session (v0.5.x): the bucket is its own round, into the target only, as
            # SGLang's own update path loads it there.
            return rank.update(dict(body, selector=body.get("selector") or "target"))
        return True, f"received {rank.receiver.receive(body)} bytes"
    except Exception as e:
        if _STATE.selector is not None:
            _discard(f"a bucket failed: {e}")
        raise


def _discard(reason):
    _STATE.failure = reason
    rank = _STATE.rank
    if rank is not None and rank.receiver.in_session:
        rank.abort(reason)


def _destroy(group_name):
    if _STATE.rank is None:
        return False, "The group to be destroyed does not exist."
    if _STATE.selector is not None:
        _discard(f"the group '{group_name}' was destroyed during the round")
    return _STATE.rank.destroy_group(group_name)


# --- hooks: the group and the buckets, where each build's calls go --------------------------


def _init_body(
    master_address, master_port, rank_offset, world_size, group_name="weight_update_group", backend="nccl"
):
    return {
        "master_address": master_address,
        "master_port": int(master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "group_name": group_name,
        "backend": backend,
    }


def _guarded(fn):
    """SGLang's (success, message) answer for a hooked group call."""
    try:
        return fn()
    except Exception as e:
        return False, f"weightcast: {e}"


def _updater_init(
    updater, master_address, master_port, rank_offset, world_size, group_name, backend="nccl", *args, **kwargs
):
    runner = updater.get_model_runner() if callable(getattr(updater, "get_model_runner", None)) else updater
    model = updater.get_model() if callable(getattr(updater, "get_model", None)) else updater.model
    body = _init_body(master_address, master_port, rank_offset, world_size, group_name, backend)
    return _guarded(
        lambda: _make_rank(model, runner.tp_rank, runner.tp_size, _device(runner)).init_group(body)
    )


def _updater_receive(
    updater, names, dtypes, shapes, group_name="weight_update_group", load_format=None, *args, **kwargs
):
    body = {
        "names": list(names),
        "dtypes": [str(d).replace("torch.", "") for d in dtypes],
        "shapes": [list(s) for s in shapes],
        "group_name": group_name,
    }
    if load_format is not None:
        body["load_format"] = load_format
    _receive(body)
    return []  # SGLang loads nothing: the commit at end_weight_update does


def _updater_destroy(updater, group_name="weight_update_group", *args, **kwargs):
    return _guarded(lambda: _destroy(group_name))


def _worker_call(method):
    def hook(worker, recv_req, *args, **kwargs):
        req = fields(recv_req)
        runner = worker.model_runner
        try:
            if method == "init_weights_update_group":
                rank = _make_rank(runner.model, runner.tp_rank, runner.tp_size, _device(runner))
                return rank.init_group(req)
            if method == "destroy_weights_update_group":
                return _destroy(req.get("group_name", "weight_update_group"))
            return _receive(req)
        except Exception as e:  # SGLang answers (success, message); the HTTP layer makes it a 400
            return False, f"weightcast: {e}"

    return hook


def _worker_tensor(worker, recv_req, *args, **kwargs):
    """REPLACE hook on TpModelWorker.update_weights_from_tensor where SGLang has no sessions
    (v0.5.x; its shape read at sgl-project/sglang python/sglang/srt/managers/tp_worker.py
    @4f34e24a: entry ``tp_rank`` of ``serialized_named_tensors`` unpickled and loaded with the
    request's ``load_format``, answering (success, message)). Here the entry is read only with
    WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1 (weightcast.pickled), and each request is its own
    round into the target, as SGLang loads it there: staged, verified, committed at once."""
    req = fields(recv_req)
    runner = worker.model_runner
    try:
        if req.get("selector", "target") not in ("all", "target"):
            raise ValueError(
                f"selector '{req['selector']}': this SGLang has no sessions; tensors load into the target"
            )
        rank = _make_rank(runner.model, runner.tp_rank, runner.tp_size, _device(runner))
        return rank.update_pickled(dict(req, selector="target"))
    except Exception as e:  # SGLang answers (success, message); the HTTP layer makes it a 400
        return False, f"weightcast: {e}"


# --- hooks: sessions ------------------------------------------------------------------------


def _begin(original, manager, recv_req, *args, **kwargs):
    out = original(manager, recv_req, *args, **kwargs)
    _STATE.manager = manager
    _STATE.selector = fields(recv_req).get("selector", "all")
    _STATE.failure = None
    return out


def _end(original, manager, recv_req, *args, **kwargs):
    """Commits the round into the covered runners, then lets SGLang end its session (its
    post-load processing on exactly those runners). A failed commit answers success false."""
    failure = _STATE.failure
    rank = _STATE.rank
    if failure is None and rank is not None and rank.receiver.in_session:
        try:
            rank.end()
        except Exception as e:
            failure = f"the commit failed: {e}"
    _STATE.selector, _STATE.failure = None, None
    out = original(manager, recv_req, *args, **kwargs)
    if failure is None:
        return out
    return type(out)(success=False, message=f"weightcast: {failure}")


def _manager_tensor(manager, recv_req, *args, **kwargs):
    """REPLACE hook on the manager's update_weights_from_tensor (main @00a2ca2e: it asserts an open
    session, unpickles entry tp_rank of serialized_named_tensors and loads it into the selected
    runners). Here the entry is read only with WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1
    (weightcast.pickled) and staged in the round's weightcast session; the commit at end loads it.
    A refused or failed bucket discards the round (end answers success false)."""
    out = _resolve(TENSOR_OUTPUT)
    req = fields(recv_req)
    try:
        message, ok = _receive_tensor(manager, dict(req)), True
    except Exception as e:
        message, ok = f"weightcast: {e}", False
    if ok:
        manager._weight_update_loaded = True  # as after SGLang's own load: end skips post_load_weights
        record = getattr(manager, "record_weight_version_after_update", None)
        if record is not None:
            record(req.get("weight_version"))
    group = getattr(manager, "tp_cpu_group", None)
    if group is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier(group=group)
    return out(success=ok, message=message)


def _receive_tensor(manager, req):
    runner = manager.tp_worker.model_runner
    rank = _make_rank(runner.model, runner.tp_rank, runner.tp_size, _device(runner))
    if _STATE.selector is None:
        raise RuntimeError("update_weights_from_tensor requires an open begin_weight_update session")
    selector = req.pop("selector", None)
    if selector not in (None, "all", _STATE.selector):
        raise ValueError(f"selector: '{selector}' in a session begun for '{_STATE.selector}'")
    _session_begin()
    try:
        local, data = pickled.decode(req, rank.engine_rank)
        return f"copied {rank.receiver.receive_local(local, data)} bytes"
    except Exception as e:
        _discard(f"a bucket failed: {e}")
        raise


# --- hooks: run-time LoRA ------------------------------------------------------------------


def _load_adapter(runner, rank, lora_ref, config_dict, added_tokens_config, upsert, stage):
    """One adapter load: a weightcast adapter session on this rank (``stage(rank)`` receives its
    tensors), committed, then handed whole to SGLang's LoRA manager; a LoRAUpdateOutput."""
    out = _resolve(LORA_OUTPUT)
    name = lora_ref.lora_name

    def refused(message):
        return out(
            success=False,
            error_message=f"weightcast: adapter '{name}' not loaded (what SGLang held is kept): {message}",
        )

    if _STATE.selector not in (None, "target"):
        return refused(
            f"adapters apply to the target model only, and a weight-update session for "
            f"'{_STATE.selector}' is open"
        )
    if rank is None:
        return refused("no weight-update group: call init_weights_update_group first")
    try:
        rank.begin("target", lora={"lora_name": name, "config": dict(config_dict or {}), "op": "upsert"})
    except Exception as e:
        return refused(str(e))
    try:
        stage(rank)
        rank.end()
    except Exception as e:
        if rank.receiver.in_session:
            rank.abort(f"adapter '{name}': {e}")
        return refused(str(e))
    tensors = rank.receiver.adapter(name)["tensors"]
    rank.receiver.unload_adapter(name)  # SGLang's LoRA manager holds it from here on
    return runner.lora_manager.load_lora_adapter_from_tensors(
        lora_ref, tensors, config_dict, added_tokens_config, upsert=upsert
    )


def _runner_lora_distributed(
    runner,
    lora_ref,
    names,
    dtypes,
    shapes,
    config_dict,
    group_name="weight_update_group",
    added_tokens_config=None,
    upsert=False,
    *args,
    **kwargs,
):
    """REPLACE hook on ModelRunner.load_lora_adapter_from_distributed (sglang-miles @a0e1292f:
    one broadcast per tensor in ``names`` order on the group, then the LoRA manager's
    load_lora_adapter_from_tensors). The group is weightcast's, so the tensors arrive through the
    rank's receiver, in an adapter session."""
    body = {
        "names": list(names),
        "dtypes": [str(d).replace("torch.", "") for d in dtypes],
        "shapes": [list(s) for s in shapes],
        "group_name": group_name,
    }
    return _load_adapter(
        runner,
        _STATE.rank,
        lora_ref,
        config_dict,
        added_tokens_config,
        upsert,
        lambda rank: rank.receiver.receive(body),
    )


def _worker_lora_tensors(worker, recv_req, *args, **kwargs):
    """REPLACE hook on TpModelWorker.load_lora_adapter_from_tensors (sglang-miles @a0e1292f: entry
    ``tp_rank`` of ``serialized_named_tensors``, a dict of tensors or a flattened bucket): the
    entry is read only with WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1 (weightcast.pickled)."""
    req = fields(recv_req)
    runner = worker.model_runner
    rank = _make_rank(runner.model, runner.tp_rank, runner.tp_size, _device(runner))

    def stage(rank):
        local, data = pickled.decode(req, rank.engine_rank)
        rank.receiver.receive_local(local, data)

    return _load_adapter(
        runner,
        rank,
        recv_req.to_ref(),
        req.get("config_dict"),
        req.get("added_tokens_config"),
        bool(req.get("upsert")),
        stage,
    )


# --- the external-receiver seam -------------------------------------------------------------


class SeamReceiver:
    """What ``receiver(context)`` returns: one TP worker's weightcast rank behind SGLang's
    ``receive(payload)`` / ``destroy()``. A payload is one of our bucket bodies, or
    {"buckets": [body, ...]}; the trainer broadcasts each bucket's tensors in order after
    posting the request."""

    def __init__(self, context):
        payload = dict(context.init_payload or {})
        self.group_name = context.group_name
        device = context.device
        ordinal = device.index if getattr(device, "type", "cpu") == "cuda" else None
        rank = _make_rank(context.model, context.tp_rank, context.tp_size, ordinal)
        body = _init_body(
            context.master_address,
            context.master_port,
            context.rank_offset,
            context.world_size,
            context.group_name,
            payload.get("backend", "nccl"),
        )
        ok, message = rank.init_group(body)
        if not ok:
            raise RuntimeError(message)

    def receive(self, payload):
        if not isinstance(payload, dict):
            raise ValueError(f"receiver_payload: a JSON object is required (got {type(payload).__name__})")
        for body in payload.get("buckets", [payload]):
            _receive(dict(body, group_name=self.group_name))

    def destroy(self):
        ok, message = _destroy(self.group_name)
        if not ok:
            raise RuntimeError(message)


def receiver(context):
    """The factory SGLang's ``--weight-update-receivers weightcast.sglang.receiver`` names."""
    return SeamReceiver(context)


# --- registration ---------------------------------------------------------------------------


def _hooks(mode):
    from sglang.srt.plugins.hook_registry import HookType

    hooks = []
    if mode in ("weight_updater", "model_runner"):
        owner = UPDATER if mode == "weight_updater" else RUNNER
        hooks += [
            (f"{owner}.init_weights_update_group", _updater_init, HookType.REPLACE),
            (f"{owner}.receive_weights_from_distributed", _updater_receive, HookType.REPLACE),
            (f"{owner}.destroy_weights_update_group", _updater_destroy, HookType.REPLACE),
        ]
    elif mode == "tp_worker":
        for method in GROUP_METHODS + ("update_weights_from_distributed",):
            hooks.append((f"{WORKER}.{method}", _worker_call(method), HookType.REPLACE))
        if _resolve(f"{WORKER}.update_weights_from_tensor") is not None:
            hooks.append((f"{WORKER}.update_weights_from_tensor", _worker_tensor, HookType.REPLACE))
    if _resolve(f"{MANAGER}.begin_weight_update") is not None:
        hooks += [
            (f"{MANAGER}.begin_weight_update", _begin, HookType.AROUND),
            (f"{MANAGER}.end_weight_update", _end, HookType.AROUND),
        ]
    if _resolve(f"{MANAGER}.update_weights_from_tensor") is not None:
        hooks.append((f"{MANAGER}.update_weights_from_tensor", _manager_tensor, HookType.REPLACE))
    if _resolve(LORA_DISTRIBUTED) is not None:
        hooks.append((LORA_DISTRIBUTED, _runner_lora_distributed, HookType.REPLACE))
    if _resolve(LORA_TENSORS) is not None:
        hooks.append((LORA_TENSORS, _worker_lora_tensors, HookType.REPLACE))
    state = CONTROLLER_STATE if _resolve(CONTROLLER_STATE) is not None else SCHEDULER_STATE
    hooks.append((state, _announce_state, HookType.AFTER))
    return hooks


def register():
    """sglang.srt.plugins entry point: registers the hooks this build needs (applied by
    load_plugins()). Raises, naming the minimum version, where the build has no way in."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    mode = detect_mode()
    _STATE.mode = mode
    for target, fn, kind in _hooks(mode):
        if target not in _STATE.registered:
            HookRegistry.register(target, fn, kind)
            _STATE.registered.append(target)
    logger.info("weightcast %s: SGLang plug-in registered (%s)", __version__, mode)
