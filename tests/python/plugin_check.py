"""Loads weightcast's vLLM and SGLang plug-ins into the real engines wherever they import.

    PYTHONPATH=<build>/python python3 tests/python/plugin_check.py

vLLM: the vllm.general_plugins entry point registers the `weightcast` weight-transfer backend in
WeightTransferEngineFactory, the backend class is built over vLLM's WeightTransferEngine (its
abstract methods all implemented) and parses an init_weights_update_group body; the worker
extension's methods are all prefixed `weightcast_`; the backend parses init_info and update_info
with the shared parsers.

SGLang: the plug-in registers hooks only where the build has their targets (TpModelWorker,
ModelRunner or the model runner's WeightUpdater, the weight-updater manager's begin/end, the
internal-state announce), HookRegistry.apply_hooks() applies every one, the announce lists exactly
those, request structs are read by their fields, and on builds with the external-receiver seam
its allowlist names weightcast.sglang.receiver. WEIGHTCAST_SGLANG_STANDIN (the ctest sets it)
checks every cell of the upstream harness's stand-in SGLang (tests/upstream/sglang/standin/).

Exit 77 when neither engine imports, unless WEIGHTCAST_REQUIRE_CUDA_DEVICES is
set (scripts/gpu-check.sh): a GPU machine is where they must be checked, so there it fails.
WEIGHTCAST_REQUIRE_ENGINES=vllm,sglang fails unless each named engine imports and passes.
WEIGHTCAST_VLLM_STANDIN (the ctest sets it) checks vLLM against the upstream harness's stand-in
(tests/upstream/vllm/standin/, version WEIGHTCAST_STANDIN_VLLM) where no real vLLM is installed.
"""

import importlib
import inspect
import os
import sys

ran = []


def _vllm_standin(root):
    """WEIGHTCAST_VLLM_STANDIN=<tests/upstream/vllm/standin>: check against the harness's stand-in
    of vLLM (the version WEIGHTCAST_STANDIN_VLLM names, default main) instead of a real vLLM, with
    the plug-in's entry point declared in generated package metadata, as an install declares it."""
    import tempfile

    site = tempfile.mkdtemp(prefix="wc-plugin-check-")
    info = os.path.join(site, "weightcast_plugin_check-0.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: weightcast-plugin-check\nVersion: 0.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\nweightcast = weightcast.vllm:register\n")
    sys.path[:0] = [root, site]
    import atexit
    import shutil

    atexit.register(shutil.rmtree, site, True)


def check_vllm():
    if os.environ.get("WEIGHTCAST_VLLM_STANDIN"):
        _vllm_standin(os.environ["WEIGHTCAST_VLLM_STANDIN"])
    try:
        import vllm  # noqa: F401
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError as e:
        print(f"vLLM: not importable here ({e})")
        return
    import weightcast.vllm as shim

    methods = [n for n, _ in inspect.getmembers(shim.WeightcastWorkerExtension, inspect.isfunction)]
    assert methods and all(n.startswith(("weightcast_", "_weightcast")) for n in methods), methods
    reason = shim.backend_unsupported()
    if reason is not None:
        # A build that cannot host the backend: registering says why, naming the minimum version
        # and the worker extension, and registers nothing (vLLM then refuses the backend itself).
        shim.register()
        assert "weightcast" not in WeightTransferEngineFactory._registry, "registered where unsupported"
        assert f">= {shim.MIN_BACKEND_VLLM}" in reason and shim.EXTENSION in reason, reason
        ran.append(f"vLLM {vllm.__version__} (worker extension only: {reason})")
        return
    if os.environ.get("WEIGHTCAST_VLLM_STANDIN"):
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # through the entry point, as every vLLM process does
    shim.register()
    shim.register()  # idempotent: every process loads plugins once, some twice
    assert "weightcast" in WeightTransferEngineFactory._registry, "backend not registered"
    cls = WeightTransferEngineFactory._registry["weightcast"]()
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    assert not missing, f"abstract methods left: {missing}"
    # The backend reads init_info / update_info with the shared parsers (its parse_* overrides).
    init = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
    info = cls.parse_init_info(None, init)
    assert info.body["world_size"] == 2 and info.options == {"keep_delta_base": False}, info
    update = cls.parse_update_info(None, {"names": ["a"], "dtypes": ["bfloat16"], "shapes": [[2]]})
    assert update.info["names"] == ["a"], update
    for name in (
        "init_transfer_engine",
        "start_weight_update",
        "receive_weights",
        "finish_weight_update",
        "shutdown",
        "set_weight_update_target",
        "reset_weight_update_target",
    ):
        assert name in vars(cls), f"{name} not implemented"
    ran.append(f"vLLM {vllm.__version__}")


SGLANG_STANDIN_CELLS = ("v0.5-dataclass", "miles-v0.5.16", "main-weight-updater", "main-external-receivers")


def _sglang_build(label, through_entry_point):
    """The SGLang plug-in against the SGLang that imports now: it registers hooks only where this
    build has the targets, SGLang applies every one (the announce lists exactly those), request
    structs are read by their fields (dataclass or msgspec Struct), and where the build has the
    external-receiver seam the factory is what its allowlist names."""
    import pkgutil

    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry

    import weightcast.sglang as shim

    mode = shim.detect_mode()
    if through_entry_point:
        from sglang.srt.plugins import load_plugins

        load_plugins()  # the entry point from the package metadata, as every SGLang process does
    else:
        shim.register()
        HookRegistry.apply_hooks()
    shim.register()  # idempotent: a process that loads plug-ins twice registers nothing new
    registered = list(shim._STATE.registered)
    assert registered, "no hooks registered"
    assert any(t.endswith(".get_internal_state") for t in registered), "no server-info announce hook"
    unapplied = [t for t in registered if t not in HookRegistry._patched]
    assert not unapplied, f"hooks this build could not apply: {unapplied}"
    for target in registered:
        assert hasattr(pkgutil.resolve_name(target), "__wrapped__"), f"{target} was not hooked"
    assert shim.announce()["hooked"] == [".".join(t.split(".")[-2:]) for t in registered], shim.announce()
    io = importlib.import_module("sglang.srt.managers.io_struct")
    req = io.UpdateWeightsFromDistributedReqInput(names=["a"], dtypes=["bfloat16"], shapes=[[2]])
    read = shim.fields(req)
    assert read["names"] == ["a"] and read["group_name"] == "weight_update_group", read
    if mode == "receiver":
        seam = importlib.import_module(shim.SEAM)
        assert pkgutil.resolve_name(shim.RECEIVER_FACTORY) is shim.receiver
        try:
            seam.build_weight_update_receiver(shim.RECEIVER_FACTORY, [], None)
            raise AssertionError("the seam built a receiver its allowlist does not name")
        except ValueError:
            pass
    ran.append(f"{label} {getattr(sglang, '__version__', '?')} ({mode})")


def _sglang_standin(root):
    """WEIGHTCAST_SGLANG_STANDIN=<tests/upstream/sglang/standin>: every cell of the upstream
    harness's stand-in SGLang in turn (fresh modules each), the plug-in loaded through an entry
    point declared in generated package metadata, as an install declares it."""
    import shutil
    import tempfile

    site = tempfile.mkdtemp(prefix="wc-plugin-check-sglang-")
    try:
        info = os.path.join(site, "weightcast_sglang_check-0.0.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: weightcast-sglang-check\nVersion: 0.0\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write("[sglang.srt.plugins]\nweightcast = weightcast.sglang:register\n")
        sys.path[:0] = [root, site]
        for cell in SGLANG_STANDIN_CELLS:
            for name in [m for m in sys.modules if m.split(".")[0] == "sglang" or m == "weightcast.sglang"]:
                del sys.modules[name]
            os.environ["SGLANG_STANDIN_CELL"] = cell
            _sglang_build(f"stand-in SGLang {cell}", through_entry_point=True)
    finally:
        sys.path[:] = [p for p in sys.path if p not in (root, site)]
        shutil.rmtree(site, ignore_errors=True)


def check_sglang():
    if os.environ.get("WEIGHTCAST_SGLANG_STANDIN"):
        _sglang_standin(os.environ["WEIGHTCAST_SGLANG_STANDIN"])
        return
    try:
        import sglang  # noqa: F401
        from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: F401
    except ImportError as e:
        print(f"SGLang: not importable here ({e})")
        return
    _sglang_build("SGLang", through_entry_point=False)


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
