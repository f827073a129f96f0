"""weightcast inside SGLang: an ``sglang.srt.plugins`` entry point (``weightcast =
weightcast.sglang:register`` in the package metadata) whose hooks route each TP worker's
weight-update calls through a weightcast Receiver.

Targets SGLang's plug-in framework (``sglang/srt/plugins``: ``HookRegistry.register(target, fn,
HookType.REPLACE)``, loaded by ``load_plugins()`` in every process) and the
``TpModelWorker.init_weights_update_group / update_weights_from_distributed /
destroy_weights_update_group(self, recv_req) -> (success, message)`` methods of SGLang main as of
2026-12 (v0.5.x); ``begin_weight_update`` / ``end_weight_update`` are hooked where the build has
them (the sglang-miles branch). Neither SGLang nor a GPU is available where this was written:
scripts/gpu-check.sh loads the plug-in wherever SGLang imports.

    pip install ./python && python -m sglang.launch_server --model-path MODEL ...
    (SGLANG_PLUGINS=weightcast restricts loading to this one)

The plug-in also announces itself: an AFTER hook on ``Scheduler.get_internal_state`` adds a
``weightcast`` key ({"version", "receiver", "native_routes": false, "hooked"}) to each
scheduler's internal state, which SGLang's ``/server_info`` and ``/get_server_info`` return under
``internal_states``; weightcast-train reads it (sync/trainer/server_info_answers.h) and names the
receiver in its server info.

With the plug-in, each TP worker joins the trainer's group as its own weightcast rank: the
trainer's chain broadcast, delta buckets and owned sessions reach it, and a bucket is staged and
verified before ``load_weights`` sees it (per bucket without begin/end, per session with them).
"""

from . import __version__
from .engine_rank import EngineRank

WORKER = "sglang.srt.managers.tp_worker.TpModelWorker"
SCHEDULER_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
HOOKED = ("init_weights_update_group", "update_weights_from_distributed", "destroy_weights_update_group",
          "begin_weight_update", "end_weight_update")


def announce():
    """The `weightcast` key of /server_info (the torch reference engine answers the same)."""
    return {"version": __version__, "receiver": "weightcast.Receiver", "native_routes": False,
            "hooked": [f"TpModelWorker.{m}" for m in HOOKED]}


def _announce_state(result, *args, **kwargs):
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        state["weightcast"] = announce()
    return result


def _fields(req):
    return {k: v for k, v in vars(req).items() if not k.startswith("_") and v is not None}


def _rank(worker):
    rank = getattr(worker, "_weightcast", None)
    if rank is None:
        runner = worker.model_runner
        device = getattr(runner, "gpu_id", None) if getattr(runner, "device", "cpu") == "cuda" else None
        rank = EngineRank(runner.model, engine_rank=runner.tp_rank, rank_count=runner.tp_size, device=device)
        worker._weightcast = rank
    return rank


def _answer(fn):
    def hook(worker, recv_req, *args, **kwargs):
        try:
            return fn(_rank(worker), recv_req)
        except Exception as e:  # SGLang answers (success, message); the HTTP layer makes it a 400
            return False, f"weightcast: {e}"

    return hook


def register():
    """sglang.srt.plugins entry point: registers the hooks (applied by load_plugins())."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    routes = {
        "init_weights_update_group": lambda r, q: r.init_group(_fields(q)),
        "update_weights_from_distributed": lambda r, q: r.update(_fields(q)),
        "destroy_weights_update_group": lambda r, q: r.destroy_group(getattr(q, "group_name", "weight_update_group")),
        "begin_weight_update": lambda r, q: (True, str(r.begin(getattr(q, "selector", "all")))),
        "end_weight_update": lambda r, q: (True, str(r.end())),
    }
    for method, fn in routes.items():
        HookRegistry.register(f"{WORKER}.{method}", _answer(fn), HookType.REPLACE)
    HookRegistry.register(SCHEDULER_STATE, _announce_state, HookType.AFTER)
