"""Stand-in of sgl-project/sglang python/sglang/srt/plugins/hook_registry.py @106f37ce.

Reproduced: HookType BEFORE / AFTER / AROUND / REPLACE and their call shapes (BEFORE
fn(*args, **kwargs) -> (args, kwargs) or None; AFTER fn(result, *args, **kwargs) -> new result or
None; AROUND fn(original, *args, **kwargs); REPLACE fn(*args, **kwargs)); REPLACE hooks applied
first, the others wrapping them; every wrapper carries ``__wrapped__``; ``_hooks`` and ``_patched``;
apply_hooks() resolves each target with pkgutil.resolve_name and, when that fails (the target does
not exist in this build), logs the error and goes on with the next target.
"""

import functools
import logging
import pkgutil
from collections import defaultdict
from enum import Enum

logger = logging.getLogger(__name__)


class HookType(Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


def _wrap(original, hook, kind):
    if kind == HookType.REPLACE:

        def wrapper(*args, **kwargs):
            return hook(*args, **kwargs)

    elif kind == HookType.BEFORE:

        def wrapper(*args, **kwargs):
            changed = hook(*args, **kwargs)
            if changed is not None:
                args, kwargs = changed
            return original(*args, **kwargs)

    elif kind == HookType.AFTER:

        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            modified = hook(result, *args, **kwargs)
            return result if modified is None else modified

    elif kind == HookType.AROUND:

        def wrapper(*args, **kwargs):
            return hook(original, *args, **kwargs)

    else:
        raise ValueError(f"Unknown hook type: {kind}")
    wrapper = functools.wraps(original)(wrapper)
    wrapper.__wrapped__ = original
    return wrapper


class HookRegistry:
    _hooks = defaultdict(list)
    _patched = set()

    @classmethod
    def register(cls, target, hook, hook_type=HookType.AFTER):
        if isinstance(hook, type) and hook_type != HookType.REPLACE:
            raise TypeError(f"Class {hook.__name__} can only be used with HookType.REPLACE")
        cls._hooks[target].append((hook_type, hook))

    @classmethod
    def apply_hooks(cls):
        for target, hooks in sorted(cls._hooks.items()):
            if target in cls._patched:
                continue
            try:
                cls._apply_target(target, hooks)
                cls._patched.add(target)
            except Exception:
                logger.exception("Failed to apply hooks to %s", target)

    @classmethod
    def _apply_target(cls, target, hooks):
        owner_path, attr = target.rsplit(".", 1)
        owner = pkgutil.resolve_name(owner_path)
        original = getattr(owner, attr)
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
        wrap_as = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
        if wrap_as is not None:
            original = raw.__func__
        wrapped = original
        for kind, hook in sorted(hooks, key=lambda h: 0 if h[0] == HookType.REPLACE else 1):
            wrapped = hook if isinstance(hook, type) else _wrap(wrapped, hook, kind)
        setattr(owner, attr, wrap_as(wrapped) if wrap_as else wrapped)
        logger.info("Applied %d hook(s) to %s", len(hooks), target)

    @classmethod
    def reset(cls):
        cls._hooks.clear()
        cls._patched.clear()
