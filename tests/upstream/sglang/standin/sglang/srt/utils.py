"""Stand-in of sgl-project/sglang python/sglang/srt/utils/common.py (``init_custom_process_group``,
``dynamic_import``; ``deserialize_named_tensors`` stands for MultiprocessingSerializer.deserialize
plus weight_sync/tensor_bucket.py's FlattenedTensorBucket.reconstruct_tensors, which the tensor
routes call on entry ``tp_rank``), the group as INTEROP.md §2(c) records it: a tcp:// rendezvous, then
PrefixStore(group_name, store) and torch's ``_new_process_group_helper`` with the group's name.
On Debian's torch 1.13 the helper does not register the group, so it is registered here the way
torch 2.x does (identity rank map)."""

import base64
import datetime
import importlib
import pickle

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def init_custom_process_group(backend, init_method, world_size, rank, group_name, timeout=None):
    timeout = timeout or datetime.timedelta(seconds=60)
    store, rank, world_size = next(dist.rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    pg = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        backend,
        dist.PrefixStore(group_name, store),
        group_name=group_name,
        timeout=timeout,
    )
    c10d._pg_map[pg] = (backend, store)
    c10d._pg_names[pg] = group_name
    c10d._pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def destroy_custom_process_group(pg):
    for table in (c10d._pg_map, c10d._pg_names, c10d._pg_group_ranks):
        table.pop(pg, None)


def dynamic_import(path):
    module, attr = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)


def deserialize_named_tensors(entries, tp_rank, load_format=None):
    """(name, tensor) pairs of entry `tp_rank` (plain pickle in base64 here, ForkingPickler
    upstream): a list of pairs or a dict, or a flattened bucket with load_format
    "flattened_bucket"."""
    obj = pickle.loads(base64.b64decode(entries[tp_rank]))
    if load_format == "flattened_bucket":
        flat = obj["flattened_tensor"]
        return [
            (m.name, flat[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape)) for m in obj["metadata"]
        ]
    return list(obj.items()) if isinstance(obj, dict) else obj
