"""What the reference engine says about itself: /server_info in each API's shape, and the
`weightcast` key every shape carries (what a trainer reads to know a weightcast receiver runs
inside; the SGLang plug-in adds the same key to SGLang's answer)."""

from .. import __version__, _weightcast

# What each of the engine's runners holds (its Receiver's filters): the workers build their
# runners with them, the front names them in /server_info.
TARGET_FILTER = "model.*,lm_head.weight"
DRAFT_FILTER = "draft.*"


def announce(engine):
    return {
        "version": __version__,
        "receiver": "weightcast.Receiver",
        "runners": engine.runners(),
        "native_routes": engine.cfg["api"] == "weightcast",
        "routes": ["/weights_checksum"],
    }


def native_info(engine):
    """weightcast's /server_info (--api weightcast)."""
    cfg = engine.cfg
    return {
        "success": True,
        "message": "ok",
        "version": __version__,
        "runners": engine.runners(),
        "selectors": ["all", "target", "draft"],
        "backends": ["gloo"],
        "rank_count": cfg["tp"],
        "tp_size": cfg["tp"],
        "dp_size": 1,
        "pp_size": 1,
        "weight_version": engine.weight_version,
        "engine": "weightcast.reference",
        "weight_receiver": "weightcast.Receiver",
        "speculative_algorithm": "EAGLE" if cfg["draft"] else None,
        "session_selector": engine.sessions.selector(),
        # Same-host trainers may send colocated buckets (docs/colocated.md): every TP worker runs
        # on this host and copies each bucket out of the trainer's segment.
        "colocate_host": _weightcast.host_identity() or None,
        # Adapter sessions (docs/lora.md): the adapters held, as weightcast-engine lists them.
        "lora_adapters": engine.adapters(),
        "weightcast": announce(engine),
        "internal_states": [{"weightcast": announce(engine)}],
    } | _plans(engine)


def _plans(engine):
    """What each rank keeps of each tensor (docs/sharding.md), when the engine announces it."""
    plans = engine.shard_plans()
    return {"shard_plans": plans} if plans is not None else {}


def sglang_info(engine):
    """SGLang's /server_info shape (--api sglang): its ServerArgs fields the trainer reads, and the
    plug-in's announce in internal_states, as a real SGLang with weightcast.sglang answers."""
    cfg = engine.cfg
    return {
        "tp_size": cfg["tp"],
        "dp_size": 1,
        "pp_size": 1,
        "weight_version": engine.weight_version,
        "speculative_algorithm": "EAGLE" if cfg["draft"] else None,
        "model_path": cfg["model"],
        "version": "torch-engine",
        "internal_states": [{"weightcast": announce(engine)}],
    }


def vllm_info(engine):
    """vLLM's /server_info (dev mode, config_format=json) for this engine, plus the announce."""
    cfg = engine.cfg
    spec = {"method": "eagle", "num_speculative_tokens": 4} if cfg["draft"] else None
    parallel = {"tensor_parallel_size": cfg["tp"], "pipeline_parallel_size": 1, "data_parallel_size": 1}
    config = {
        "model_config": {"model": cfg["model"]},
        "parallel_config": parallel,
        "speculative_config": spec,
        "weight_transfer_config": {"backend": "weightcast"},
    }
    return {"vllm_config": config, "vllm_env": {}, "system_env": {}, "weightcast": announce(engine)}
