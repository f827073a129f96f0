"""Shared by the interop scripts: SGLang's init_custom_process_group on Debian's torch 1.13.

SGLang (python/sglang/srt/utils/common.py) and Miles (a copy of it) build a weight-update group
with rendezvous -> PrefixStore(group_name) -> _new_process_group_helper(..., group_name). torch 2.x
registers the resulting group so dist.broadcast(group=pg) accepts it; 1.13's helper does not, so
it is registered here the way 2.x does it (identity rank map).
"""
import datetime

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def custom_group(store, world_size, rank, group_name, backend="gloo", timeout=None):
    timeout = timeout or datetime.timedelta(seconds=60)
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


def connect_store(host, port, world_size, timeout):
    """A torch worker's store: what the tcp:// rendezvous gives ranks other than 0."""
    return dist.TCPStore(host, port, world_size, False, timeout)


def release_group(pg):
    """Forgets a group made by custom_group, as dist.destroy_process_group(pg) does on 2.x."""
    for table in (c10d._pg_map, c10d._pg_names, c10d._pg_group_ranks):
        table.pop(pg, None)
