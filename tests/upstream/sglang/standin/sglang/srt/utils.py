"""Stand-in of sgl-project/sglang python/sglang/srt/utils/common.py (``init_custom_process_group``,
``dynamic_import``), as INTEROP.md §2(c) records them: a tcp:// rendezvous, then
PrefixStore(group_name, store) and torch's ``_new_process_group_helper`` with the group's name.
On Debian's torch 1.13 the helper does not register the group; tests/interop/sglang_compat.py
registers it the way torch 2.x does (identity rank map), for the interop peers and this stand-in
alike."""

import datetime
import importlib

import torch.distributed as dist
from sglang_compat import custom_group, release_group  # tests/interop: torch 1.13's missing step


def init_custom_process_group(backend, init_method, world_size, rank, group_name, timeout=None):
    timeout = timeout or datetime.timedelta(seconds=60)
    store, rank, world_size = next(dist.rendezvous(init_method, rank, world_size, timeout=timeout))
    return custom_group(store, world_size, rank, group_name, backend, timeout)


def destroy_custom_process_group(pg):
    release_group(pg)


def dynamic_import(path):
    module, attr = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)
