"""Stand-in of vllm/plugins/__init__.py: load_general_plugins() reads the `vllm.general_plugins`
entry points through importlib.metadata (package metadata on sys.path, as an installed wheel
declares them), loads each and calls it, once per process. VLLM_PLUGINS (comma-separated
names) restricts which run. Upstream calls it in EngineArgs (the front) and in
WorkerWrapperBase.init_worker (every worker: @02432253).
"""

import importlib.metadata
import logging
import os

logger = logging.getLogger("vllm.plugins")
plugins_loaded = False


def load_plugins_by_group(group):
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed = None if allowed is None else [n for n in allowed.split(",") if n]
    found = {}
    for ep in importlib.metadata.entry_points(group=group):
        if allowed is not None and ep.name not in allowed:
            continue
        try:
            found[ep.name] = ep.load()
        except Exception:
            logger.exception("Failed to load plugin %s", ep.name)
    return found


def load_general_plugins():
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    for func in load_plugins_by_group("vllm.general_plugins").values():
        func()
