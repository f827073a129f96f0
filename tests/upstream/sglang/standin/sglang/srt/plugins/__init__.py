"""Stand-in of sgl-project/sglang python/sglang/srt/plugins/__init__.py @0298b5b4.

Reproduced: load_plugins() discovers the ``sglang.srt.plugins`` entry-point group through
importlib.metadata (installed distributions: a *.dist-info/entry_points.txt on sys.path),
honours the SGLANG_PLUGINS allowlist (comma-separated entry-point names), loads each entry point
and calls it; a plug-in that fails to load or to run is logged and skipped (start-up goes on);
then HookRegistry.apply_hooks(). Idempotent per process.
"""

import logging
import os
from importlib.metadata import entry_points

from sglang.srt.plugins.hook_registry import HookRegistry

logger = logging.getLogger(__name__)

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
_plugins_loaded = False


def load_plugins():
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    allowed = {x.strip() for x in os.environ.get("SGLANG_PLUGINS", "").split(",") if x.strip()} or None
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        if allowed is not None and ep.name not in allowed:
            logger.info("Skipping plugin %s (not in SGLANG_PLUGINS)", ep.name)
            continue
        try:
            func = ep.load()
        except Exception:
            logger.exception("Failed to load plugin %s from group %s", ep.name, GENERAL_PLUGINS_GROUP)
            continue
        try:
            func()
            logger.info("Executed general plugin: %s", ep.name)
        except Exception:
            logger.exception("Failed to execute general plugin: %s", ep.name)
    HookRegistry.apply_hooks()
