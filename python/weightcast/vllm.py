"""weightcast inside vLLM: a weight-transfer backend named ``weightcast`` and a worker extension.

Which way in works depends on the vLLM build (docs/engines.md, "Version matrix: vLLM"; each row
is a test under tests/upstream/vllm/):

1. Backend, vLLM >= 0.25 (``WeightTransferConfig.backend`` takes a free string, and the engine
   owns a start/update/finish lifecycle with ``WeightTransferEngine(config, vllm_config, device,
   model)``). Every process registers it through the ``vllm.general_plugins`` entry point
   ``weightcast = weightcast.vllm:register`` in the package metadata::

       VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --weight-transfer-config '{"backend": "weightcast"}'

   ``/init_weight_transfer_engine {"init_info": <init_weights_update_group body>}``,
   ``/start_weight_update`` (``/start_draft_weight_update``: the worker retargets the backend at
   its draft model with ``set_weight_update_target``), ``/update_weights {"update_info": <bucket
   body>}`` per bucket, ``/finish_weight_update {weight_version}`` map onto the Receiver's join,
   begin, receive and commit: buckets are staged and verified, and ``load_weights`` runs at
   finish, inside ``initialize_layerwise_reload`` / ``finalize_layerwise_reload`` where the build
   has them (else followed by ``process_weights_after_loading``), once per model the round
   loaded. The trainer's abort (``{"abort": true}``) drops the staging and raises: vLLM's worker
   leaves its update state only when the backend raises.

2. Worker extension, every vLLM (the only way in before 0.25)::

       VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls \\
           weightcast.vllm.WeightcastWorkerExtension

   weightcast-train sees ``worker_extension_cls`` in ``/server_info`` and drives
   ``/collective_rpc`` with ``weightcast_init(body)``, ``weightcast_begin(selector)``,
   ``weightcast_update(body)``, ``weightcast_commit(version)``, ``weightcast_abort(reason)``,
   ``weightcast_destroy(group)``, ``weightcast_version()`` (arguments are JSON text: vLLM passes
   strings only; every method is prefixed, because newer workers define ``update_weights``).
   ``weightcast_shard_plan()`` answers the worker's shard plan (docs/sharding.md), recorded from
   the target's own ``load_weights`` on meta stand-ins: the trainer then sends each worker only
   its slices, which the target slot hands to ``load_weights`` as the full tensors they stand for.
   Runners: ``target`` (``model_runner.model``) and ``draft`` (``model_runner.drafter.model``,
   where the engine runs one). As through vLLM's own API, a round updates one model: selector
   ``draft`` the draft, ``target`` or ``all`` the target.

On a build that cannot host the backend, ``register()`` registers nothing and says why (naming
the minimum version and the worker extension); vLLM then refuses ``{"backend": "weightcast"}``
itself at start.
"""

import json
import logging

from .engine_rank import EngineRank, parse_init_info, parse_update_info
from .receiver import Runner

BACKEND = "weightcast"
EXTENSION = "weightcast.vllm.WeightcastWorkerExtension"
MIN_BACKEND_VLLM = "0.25"

logger = logging.getLogger("weightcast.vllm")


def backend_unsupported():
    """None where this vLLM can host the ``weightcast`` backend, else why not (a message that
    names the minimum version and the way in that works)."""
    import vllm

    try:
        from vllm.config.weight_transfer import WeightTransferConfig
        from vllm.distributed.weight_transfer.base import WeightTransferEngine
    except ImportError as e:
        refused = f"it has no weight-transfer API ({e})"
    else:
        try:
            WeightTransferConfig(backend=BACKEND)
            refused = None
        except Exception as e:  # pydantic's ValidationError names the backends it allows
            said = " ".join(line.strip() for line in str(e).splitlines()[:3])[:240]
            refused = f"its WeightTransferConfig refuses backend '{BACKEND}' ({said})"
        if refused is None and not hasattr(WeightTransferEngine, "start_weight_update"):
            refused = "its WeightTransferEngine has no start/finish_weight_update lifecycle"
    if refused is None:
        return None
    return (
        f"weightcast: vLLM {getattr(vllm, '__version__', '?')} cannot host the '{BACKEND}' "
        f"weight-transfer backend: {refused}. The backend needs vLLM >= {MIN_BACKEND_VLLM}; on "
        f"this version start vLLM with --worker-extension-cls {EXTENSION} (weightcast-train "
        "drives it through /collective_rpc)."
    )


def register():
    """vllm.general_plugins entry point: runs in every vLLM process, the workers included."""
    reason = backend_unsupported()
    if reason is not None:
        logger.warning(reason)
        return
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "WeightcastTransferEngine")
    except ValueError:  # already registered: plugins load more than once in some processes
        pass


def _tp_place(parallel_config, device):
    """Each worker joins as its TP rank; PP stages would collide on ranks (the trainer refuses
    such engines too: sync/trainer/http/vllm_client.h)."""
    from vllm.distributed import get_tensor_model_parallel_rank

    if getattr(parallel_config, "pipeline_parallel_size", 1) != 1:
        raise ValueError("weightcast: the backend receives on TP-only engines (pipeline_parallel_size 1)")

    return {
        "engine_rank": get_tensor_model_parallel_rank(),
        "rank_count": parallel_config.tensor_parallel_size,
        "device": device.index if getattr(device, "type", "cpu") == "cuda" else None,
    }


class _ModelSlot:
    """One model a round may load (vLLM's target or its draft), loaded as vLLM's own engines load
    one: ``initialize_layerwise_reload`` before the round's first tensor and
    ``finalize_layerwise_reload`` after its last, always in pairs (between them upstream keeps
    the parameters on the meta device; finalize processes the layers that took tensors and puts
    the others back unprocessed), so quantized and post-processed models are processed once per
    round. Builds without layerwise reload: ``process_weights_after_loading`` after the round,
    only if the model took tensors (its ``load_weights`` answered names): processing is not
    idempotent (a tiled shuffle applied twice). A load that raises still finalizes, so the model
    is never left mid-reload; loads outside a round (the receiver reloading its kept base after a
    failed commit) run in a reload of their own."""

    def __init__(self, device):
        self.device = device
        self.model = self.model_config = None
        self.open = self.touched = False
        # This worker's shard plan and the full shapes it slices, once announced: tensors that
        # arrive as slices are loaded as the full tensors they stand for (shard_plan.sliced_pairs).
        self.plan = self.full_shapes = None

    def bind(self, model, model_config):
        self.model, self.model_config = model, model_config

    def begin(self):
        if self.model is None:
            raise RuntimeError("weightcast: no model to load into (a draft round without a draft model)")
        self.touched = False
        reload = _layerwise()
        if reload is not None:
            reload[0](self.model)
        self.open = True

    def load(self, pairs):
        alone = not self.open
        if alone:
            self.begin()
        if self.plan is not None:
            from .shard_plan import sliced_pairs

            pairs = sliced_pairs(pairs, self.plan, self.full_shapes)
        try:
            loaded = self.model.load_weights(iter(pairs))
        except BaseException:
            self._close()
            raise
        # vLLM's load_weights answers the names it loaded; None (older models): assume some.
        self.touched = self.touched or loaded is None or len(loaded) > 0
        if alone:
            self._close()

    def finish(self):
        if self.open:
            self._close()

    def _close(self):
        self.open = False
        reload = _layerwise()
        if reload is not None:
            reload[1](self.model, self.model_config)
        elif self.touched:
            from vllm.model_executor.model_loader.utils import process_weights_after_loading

            process_weights_after_loading(self.model, self.model_config, self.device)


def _layerwise():
    """(initialize_layerwise_reload, finalize_layerwise_reload) where this vLLM has them."""
    try:
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )
    except ImportError:
        return None
    return initialize_layerwise_reload, finalize_layerwise_reload


def _drop_stale_round(rank):
    """A new group means a new trainer: a round still staged here is one whose end never came
    (vLLM's worker left it when another layer raised after this rank had received)."""
    if rank.receiver.in_session:
        rank.abort("the trainer joined again before the previous round ended")


def _runners(slots):
    from .shard_plan import config_shape_of

    runners = [Runner(name, slot.load, begin=slot.begin, finish=slot.finish) for name, slot in slots.items()]
    # The target's adapters are checked against the base shapes its HF config implies.
    target = slots["target"]
    runners[0].shape_of = config_shape_of(lambda: getattr(target.model_config, "hf_config", None))
    return runners


def _make_engine_class():
    from dataclasses import dataclass, field

    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    reason = backend_unsupported()
    if reason is not None:
        raise RuntimeError(reason)

    @dataclass
    class WeightcastInitInfo:
        body: dict = field(default_factory=dict)  # the init_weights_update_group body
        options: dict = field(default_factory=dict)  # keep_delta_base

    @dataclass
    class WeightcastUpdateInfo:
        info: dict = field(default_factory=dict)  # the update_info dict, parsed in the rank

    class WeightcastTransferEngine(WeightTransferEngine):
        init_info_cls = WeightcastInitInfo
        update_info_cls = WeightcastUpdateInfo
        supports_draft_weight_update = True

        def __init__(self, config, vllm_config, device, model):
            super().__init__(config, vllm_config, device, model)
            self.rank = None
            # The worker names the model of each round (set_weight_update_target): never bind
            # one at init beyond the default target.
            self.slots = {"target": _ModelSlot(device), "draft": _ModelSlot(device)}
            self.slots["target"].bind(model, vllm_config.model_config)
            self._default = model
            self._round = "target"

        def set_weight_update_target(self, model, model_config, **kwargs):
            parent = getattr(super(), "set_weight_update_target", None)
            if parent is not None:
                parent(model, model_config, **kwargs)
            self._round = "target" if model is self._default else "draft"
            self.slots[self._round].bind(model, model_config)

        def reset_weight_update_target(self):
            parent = getattr(super(), "reset_weight_update_target", None)
            if parent is not None:
                parent()
            self._round = "target"

        def parse_init_info(self, init_dict):
            return WeightcastInitInfo(*parse_init_info(init_dict))

        def parse_update_info(self, update_dict):
            parse_update_info(update_dict)  # fails here, naming the field, before any receive
            return WeightcastUpdateInfo(dict(update_dict))

        def init_transfer_engine(self, init_info):
            if self.rank is None:
                self.rank = EngineRank(
                    runners=_runners(self.slots),
                    keep_delta_base=init_info.options["keep_delta_base"],
                    **_tp_place(self.parallel_config, self.device),
                )
            _drop_stale_round(self.rank)
            self.rank.init_group(init_info.body)  # a group of the same name is replaced

        def _rank(self):
            if self.rank is None:
                raise RuntimeError("weightcast: /init_weight_transfer_engine first")
            return self.rank

        def start_weight_update(self):
            self._rank().vllm_start(self._round)

        def receive_weights(self, update_info, load_weights=None):
            # load_weights: the 0.16-era signature; the model comes from the worker's target.
            self._rank().vllm_update(update_info.info)

        def finish_weight_update(self):
            self._rank().vllm_finish()

        def shutdown(self):
            if self.rank is not None:
                for group in self.rank.receiver.groups:
                    self.rank.destroy_group(group)

        @staticmethod
        def trainer_send_weights(iterator, trainer_args):
            # Abstract in vLLM's base up to at least 0.26. weightcast's sender is weightcast-train
            # (or DistributedUpdater): buckets, digests and the rendezvous are its protocol.
            raise NotImplementedError(
                "weightcast: weights are sent by weightcast-train / "
                "weightcast.DistributedUpdater, not from vLLM's trainer API"
            )

    return WeightcastTransferEngine


def __getattr__(name):
    # Built on first use, so importing weightcast.vllm never imports vLLM.
    if name == "WeightcastTransferEngine":
        cls = _make_engine_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def _json(text):
    return json.loads(text) if isinstance(text, str) else text


def _check_lora_fits(vllm_config, lora):
    """Refuses, before anything is sent, an adapter vLLM's own load would refuse after the commit:
    LoRA not enabled, or a rank over --max-lora-rank (vLLM's PEFTHelper.validate_legal)."""
    config = getattr(vllm_config, "lora_config", None)
    if config is None:
        raise ValueError("weightcast: this vLLM runs without LoRA: start it with --enable-lora")
    r = int((lora.get("config") or {}).get("r", 0))
    if r > config.max_lora_rank:
        raise ValueError(
            f"weightcast: adapter '{lora.get('lora_name')}' has rank {r}, over this vLLM's "
            f"--max-lora-rank {config.max_lora_rank}"
        )


class _AdapterFiles:
    """Committed adapters as PEFT directories (adapter_config.json, adapter_model.bin: the form
    vLLM's LoRAModel.from_local_checkpoint reads, after adapter_model.safetensors), one per name,
    each version written beside the previous ones and renamed into place. The last two versions
    of a name are kept: vLLM reloads an adapter it evicted from the path it was loaded from, and
    when the newest version's load failed that is the one before. Under WEIGHTCAST_LORA_DIR, else
    a private temporary directory removed when the worker exits."""

    def __init__(self):
        self._root = None
        self._held = {}  # lora_name -> its directories, oldest first

    def root(self):
        if self._root is None:
            import atexit
            import os
            import shutil
            import tempfile

            base = os.environ.get("WEIGHTCAST_LORA_DIR")
            if base:
                os.makedirs(base, exist_ok=True)
            self._root = tempfile.mkdtemp(prefix="weightcast-lora-", dir=base or None)
            atexit.register(shutil.rmtree, self._root, True)
        return self._root

    def write(self, adapter):
        import os
        import shutil
        import tempfile

        import torch

        name = adapter["lora_name"]
        final = tempfile.mkdtemp(prefix=f"{name}-", dir=self.root())
        staging = final + ".writing"
        os.mkdir(staging)
        config = dict(adapter.get("config") or {})
        config.update(
            r=adapter["r"], lora_alpha=adapter["lora_alpha"], target_modules=adapter["target_modules"]
        )
        config.setdefault("peft_type", "LORA")
        with open(os.path.join(staging, "adapter_config.json"), "w") as f:
            json.dump(config, f)
        torch.save(
            {k: v.contiguous() for k, v in adapter["tensors"].items()},
            os.path.join(staging, "adapter_model.bin"),
        )
        os.rmdir(final)
        os.rename(staging, final)
        held = self._held.setdefault(name, [])
        held.append(final)
        while len(held) > 2:
            shutil.rmtree(held.pop(0), ignore_errors=True)
        return final


_ADAPTER_FILES = _AdapterFiles()


def _answer(message, rank):
    return {"success": True, "message": message, "weight_version": rank.receiver.weight_version}


class WeightcastWorkerExtension:
    """Mixin appended to vLLM's worker class (--worker-extension-cls); runs in every worker with
    ``self.model_runner`` and ``self.device``. Called through ``collective_rpc``; each method
    answers a dict ({"success", "message", "weight_version"}) and raises on failure."""

    def _weightcast_rank(self):
        rank = getattr(self, "_weightcast", None)
        if rank is None:
            raise RuntimeError("weightcast: weightcast_init first")
        return rank

    def weightcast_init(self, body, keep_delta_base="false"):
        rank = getattr(self, "_weightcast", None)
        if rank is None:
            runner = self.model_runner
            slots = {"target": _ModelSlot(self.device)}
            slots["target"].bind(runner.model, self.vllm_config.model_config)
            drafter = getattr(getattr(runner, "drafter", None), "model", None)
            if drafter is not None:
                slots["draft"] = _ModelSlot(self.device)
                spec = getattr(self.vllm_config, "speculative_config", None)
                slots["draft"].bind(drafter, getattr(spec, "draft_model_config", None))
            rank = EngineRank(
                runners=_runners(slots),
                keep_delta_base=bool(_json(keep_delta_base)),
                **_tp_place(self.vllm_config.parallel_config, self.device),
            )
            self._weightcast, self._weightcast_slots = rank, slots
            self._weightcast_bind_plan()
        _drop_stale_round(rank)
        return _answer(rank.init_group(_json(body))[1], rank)

    def weightcast_begin(self, selector="target", lora=None):
        """`lora`: begin_weight_update's "lora" object (JSON text): an adapter round, refused
        for any selector but target (docs/lora.md); its commit writes the adapter for vLLM's
        /v1/load_lora_adapter."""
        rank = self._weightcast_rank()
        if selector not in ("all", "target", "draft"):
            raise ValueError(f"weightcast_begin: selector must be all, target or draft (got {selector!r})")
        # As through vLLM's own API, a round updates one model: "all" is the target's round.
        model = "draft" if selector == "draft" else "target"
        if rank.receiver.in_session:  # a round its trainer never ended (it died): drop it
            rank.abort("a new update started before the previous one finished")
        lora = _json(lora)
        if lora:
            _check_lora_fits(self.vllm_config, lora)
        answer = rank.begin(selector if lora else model, lora=lora)
        self._weightcast_round = model
        self._weightcast_adapter = lora["lora_name"] if lora else None
        out = _answer(f"session {answer['session_id']} over the {model} model", rank)
        if lora:  # the adapter this worker's receiver holds: the base of the trainer's deltas
            out.update(lora_version=answer["lora_version"], lora_digest=answer["lora_digest"])
        return out

    def weightcast_update(self, body):
        rank = self._weightcast_rank()
        body = _json(body)
        model = getattr(self, "_weightcast_round", "target")
        if body.get("selector", "all") not in ("all", model):
            raise ValueError(
                f"update: selector '{body['selector']}' in a round that updates the {model} model"
            )
        return _answer(rank.update(dict(body, selector=model))[1], rank)

    def weightcast_commit(self, version=None):
        rank = self._weightcast_rank()
        committed = rank.end(version)
        name, self._weightcast_adapter = getattr(self, "_weightcast_adapter", None), None
        if name is None:
            return _answer("committed", rank)
        answer = _answer(f"adapter '{name}' committed", rank)
        answer["lora_digest"] = committed["lora_digest"]
        if rank.engine_rank == 0:  # one copy for vLLM to load (the workers share the host)
            answer["lora_path"] = _ADAPTER_FILES.write(rank.receiver.adapter(name))
        return answer

    def weightcast_adapter_checksum(self, name):
        """/weights_checksum?lora=NAME's answer for the adapter this worker committed."""
        held = self._weightcast_rank().receiver.adapter_checksum(name)
        if held is None:
            raise KeyError(f"weightcast: no adapter '{name}' committed on this worker")
        return held

    def weightcast_abort(self, reason="aborted"):
        rank = self._weightcast_rank()
        if rank.receiver.in_session:
            rank.abort(reason)
        return _answer(f"aborted: {reason}", rank)

    def weightcast_destroy(self, group_name="weight_update_group"):
        rank = self._weightcast_rank()
        return _answer(rank.destroy_group(group_name)[1], rank)

    def weightcast_shard_plan(self):
        """This worker's shard plan for the trainer (docs/sharding.md), recorded once; where the
        target's loader cannot be followed on meta tensors, no plan (``"plan": None``, the reason
        in the message), and the worker receives whole tensors."""
        from .shard_plan import record_config_plan

        recorded = getattr(self, "_weightcast_plan", None)
        if recorded is None:
            try:
                config = getattr(self.vllm_config.model_config, "hf_config", None)
                recorded = record_config_plan(self.model_runner.model, config)
            except Exception as e:
                logger.warning("weightcast: no shard plan: %s", e)
                return {"success": True, "message": f"no shard plan: {e}", "plan": None}
            self._weightcast_plan = recorded
            self._weightcast_bind_plan()  # joined before the plan was asked for
        from vllm.distributed import get_tensor_model_parallel_rank

        return {
            "success": True,
            "message": "shard plan",
            "plan": recorded[0],
            "engine_rank": get_tensor_model_parallel_rank(),
        }

    def _weightcast_bind_plan(self):
        """The target slot loads slices by the plan this worker announced (if it did and joined)."""
        slots = getattr(self, "_weightcast_slots", None)
        if slots is not None:
            slots["target"].plan, slots["target"].full_shapes = getattr(
                self, "_weightcast_plan", (None, None)
            )

    def weightcast_version(self):
        rank = getattr(self, "_weightcast", None)
        version = rank.receiver.weight_version if rank is not None else "default"
        return {"success": True, "message": "weight_version", "weight_version": version}
