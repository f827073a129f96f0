"""Loads weightcast's vLLM and SGLang plug-ins into the real engines wherever they import.

    PYTHONPATH=<build>/python python3 tests/python/plugin_check.py

vLLM: the vllm.general_plugins entry point registers the `weightcast` weight-transfer backend in
WeightTransferEngineFactory, the backend class is built over vLLM's WeightTransferEngine (its
abstract methods all implemented) and parses an init_weights_update_group body; the worker
extension's methods are all prefixed `weightcast_`; the backend parses init_info and update_info
with the shared parsers. SGLang: the sglang.srt.plugins entry point
registers its hooks and HookRegistry.apply_hooks() resolves every TpModelWorker target that
this build has, and the server-info announce hook on Scheduler.get_internal_state. Exit 77 when neither engine imports, unless WEIGHTCAST_REQUIRE_CUDA_DEVICES is
set (scripts/gpu-check.sh): a GPU machine is where they must be checked, so there it fails.
WEIGHTCAST_REQUIRE_ENGINES=vllm,sglang fails unless each named engine imports and passes.
"""

import importlib
import inspect
import os
import sys

ran = []


def check_vllm():
    try:
        import vllm  # noqa: F401
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError as e:
        print(f"vLLM: not importable here ({e})")
        return
    import weightcast.vllm as shim
    shim.register()
    shim.register()  # idempotent: every process loads plugins once, some twice
    assert "weightcast" in WeightTransferEngineFactory._registry, "backend not registered"
    cls = WeightTransferEngineFactory._registry["weightcast"]()
    missing = [n for n in getattr(cls, "__abstractmethods__", ()) if n]
    assert not missing, f"abstract methods left: {missing}"
    # The backend reads init_info / update_info with the shared parsers (its parse_* overrides).
    init = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
    info = cls.parse_init_info(None, init)
    assert info.body["world_size"] == 2 and info.options == {"keep_delta_base": False}, info
    update = cls.parse_update_info(None, {"names": ["a"], "dtypes": ["bfloat16"], "shapes": [[2]]})
    assert update.info["names"] == ["a"], update
    for name in ("init_transfer_engine", "start_weight_update", "receive_weights",
                 "finish_weight_update", "shutdown"):
        assert name in vars(cls), f"{name} not implemented"
    methods = [n for n, _ in inspect.getmembers(shim.WeightcastWorkerExtension, inspect.isfunction)]
    assert methods and all(n.startswith("weightcast_") for n in methods), methods
    ran.append(f"vLLM {vllm.__version__}")


def check_sglang():
    try:
        import sglang  # noqa: F401
        from sglang.srt.plugins.hook_registry import HookRegistry
    except ImportError as e:
        print(f"SGLang: not importable here ({e})")
        return
    import weightcast.sglang as shim
    shim.register()
    targets = [t for t in HookRegistry._hooks if t.startswith(shim.WORKER)]
    assert targets, "no hooks registered"
    assert shim.SCHEDULER_STATE in HookRegistry._hooks, "no server-info announce hook"
    HookRegistry.apply_hooks()
    worker = importlib.import_module("sglang.srt.managers.tp_worker").TpModelWorker
    for method in ("init_weights_update_group", "update_weights_from_distributed"):
        assert hasattr(getattr(worker, method), "__wrapped__"), f"{method} was not hooked"
    scheduler = importlib.import_module("sglang.srt.managers.scheduler").Scheduler
    assert hasattr(scheduler.get_internal_state, "__wrapped__"), "get_internal_state was not hooked"
    ran.append(f"SGLang {getattr(sglang, '__version__', '?')}")


check_vllm()
check_sglang()
# WEIGHTCAST_REQUIRE_ENGINES=vllm,sglang: each named engine must import and pass (a machine
# provisioned with both must not pass on one alone).
required = [n for n in os.environ.get("WEIGHTCAST_REQUIRE_ENGINES", "").split(",") if n]
missing = [n for n in required if not any(r.lower().startswith(n.lower()) for r in ran)]
if missing:
    print(f"FAILED: WEIGHTCAST_REQUIRE_ENGINES names {', '.join(missing)}, which did not import here")
    sys.exit(1)
if ran:
    print("plug-ins loaded into: " + ", ".join(ran))
    sys.exit(0)
if os.environ.get("WEIGHTCAST_REQUIRE_CUDA_DEVICES"):
    print("FAILED: WEIGHTCAST_REQUIRE_CUDA_DEVICES is set but neither vLLM nor SGLang imports")
    sys.exit(1)
print("SKIP: neither vLLM nor SGLang imports here")
sys.exit(77)
