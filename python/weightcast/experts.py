"""One update of a mixture-of-experts model whose experts are split over expert-parallel ranks.

Every rank of a stage's expert-parallel group calls

    report = weightcast.expert_parallel_update(updater, named_tensors, ep_rank=ep_rank,
                                               ep_size=ep_size, num_experts=E, ep_group=ep_group)

with what it holds, as full HF tensors (already gathered over tensor parallelism):

- EP rank 0 is the stage's source: the dense tensors (embeddings, attention, router, norms, shared
  experts) and its own experts; it alone needs a DistributedUpdater (the others may pass None).
- Every other EP rank passes its own experts; its other tensors are ignored (they are replicas
  of EP rank 0's).
- Experts are named as HF names them, model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight
  (any name with an `experts.{e}.` segment), with `e` the local index on this rank
  (expert_index="local", Megatron's numbering; the default) or the global one ("global"). EP rank
  p holds the global experts [p * E/ep_size, (p + 1) * E/ep_size), as Megatron places them; local
  index j is global expert p * E/ep_size + j.

The stage source posts a receive per remote expert (torch.distributed point-to-point on
`ep_group`, Gloo or any backend with isend/irecv of host tensors), each into its own buffer.
gather="whole" waits for them all before the session opens (the engines keep serving
meanwhile), then sends the stage; gather="overlap" sends its own tensors first and reads each
remote expert once its receive completes, so the gather overlaps the broadcast. gather="auto"
(the default) picks "whole" when every EP rank runs on the source's host, where it measured faster
(scripts/bench-python-experts.py: receiving and broadcasting compete for the same cores), and
"overlap" when some EP rank reports another host name: the gather then uses the source's incoming
link while the broadcast uses its outgoing one. That case was measured for weightcast-train's MPI
gather (`weightcast-bench hosts --trainer-ep`, docs/performance.md), not for this torch.distributed
one. Engines receive full per-expert tensors under global names; an engine with expert
parallelism keeps its own.

`ep_group` holds the stage's EP ranks, ranked by EP rank (None: the default group, whose rank r is
EP rank r). With pipeline parallelism the stage sources (EP rank 0 of every stage) also pass
`stage`, `stages` and `sources_group`, as to weightcast.pipeline_update(). The coordinator (stage
0's source) gets the UpdateReport, every other rank None; on failure every rank raises (the
coordinator the precise exception, the others UpdateError naming it, or InputError when the
inputs were refused before any engine was contacted).
"""

import re
import socket

from ._weightcast import InputError, UpdateError
from .pipeline import run_stages

# A routed expert's tensor: the first dot-separated `experts` segment, a decimal index (no sign,
# no leading zero) and the rest of the name; as sync/model/expert_placement.h parses it.
_EXPERT = re.compile(r"^((?:.*?\.)?experts\.)(0|[1-9][0-9]{0,8})(\..+)$")


def expert_of(name):
    """The expert index in a routed expert's tensor name, or None (dense, router, shared expert)."""
    m = _EXPERT.match(name)
    return int(m.group(2)) if m else None


def with_expert_index(name, expert):
    """`name` with its expert index replaced by `expert`."""
    m = _EXPERT.match(name)
    if not m:
        raise ValueError(f"'{name}' is not a routed expert's tensor")
    return f"{m.group(1)}{expert}{m.group(3)}"


def local_experts(num_experts, ep_size, ep_rank):
    """The global experts EP rank `ep_rank` holds, in local order (Megatron's contiguous blocks)."""
    per = num_experts // ep_size
    return range(ep_rank * per, (ep_rank + 1) * per)


def _check_arguments(num_experts, ep_size, ep_rank, index, gather):
    if ep_size < 1 or not 0 <= ep_rank < ep_size:
        raise ValueError(f"ep_rank {ep_rank} is outside [0, {ep_size})")
    if num_experts < 1 or num_experts % ep_size:
        raise ValueError(f"ep_size {ep_size} must divide num_experts {num_experts}")
    if index not in ("local", "global"):
        raise ValueError(f"expert_index must be 'local' or 'global', not {index!r}")
    if gather not in ("auto", "overlap", "whole"):
        raise ValueError(f"gather must be 'auto', 'overlap' or 'whole', not {gather!r}")


def _pick_gather(gather, own_host, hosts):
    """The gather mode the source runs: auto is overlap when some EP rank is on another host."""
    if gather != "auto":
        return gather
    return "overlap" if any(h != own_host for h in hosts) else "whole"


def _split(named_tensors, *, num_experts, ep_size, ep_rank, index):
    """(dense, experts under global names, error or None) of this rank's inputs."""
    items = named_tensors.items() if hasattr(named_tensors, "items") else named_tensors
    mine = local_experts(num_experts, ep_size, ep_rank)
    dense, experts = [], []
    for name, tensor in items:
        e = expert_of(name) if isinstance(name, str) else None
        if e is None:
            if ep_rank == 0:
                dense.append((name, tensor))
            continue
        if index == "local":
            if e >= len(mine):
                return (
                    [],
                    [],
                    (
                        f"EP rank {ep_rank}: local expert {e} of '{name}' is outside "
                        f"[0, {len(mine)}) ({num_experts} experts over {ep_size} EP ranks)"
                    ),
                )
            e = mine[e]
        elif e not in mine:
            return (
                [],
                [],
                (
                    f"EP rank {ep_rank}: expert {e} of '{name}' is not one of this rank's "
                    f"[{mine.start}, {mine.stop})"
                ),
            )
        experts.append((with_expert_index(name, e), tensor))
    return dense, experts, None


def _meta(name, tensor):
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expert tensor '{name}' is a {type(tensor).__name__}, not a torch.Tensor")
    return (
        name,
        str(tensor.dtype).replace("torch.", ""),
        tuple(tensor.shape),
        tensor.numel() * tensor.element_size(),
    )


def _as_bytes(tensor):
    import torch

    return tensor.detach().cpu().contiguous().view(-1).view(torch.uint8)


def expert_parallel_update(
    updater,
    named_tensors,
    *,
    ep_rank,
    ep_size,
    num_experts,
    ep_group=None,
    expert_index="local",
    stage=0,
    stages=1,
    sources_group=None,
    version=None,
    gather="auto",
):
    import torch.distributed as dist

    _check_arguments(num_experts, ep_size, ep_rank, expert_index, gather)
    if ep_group is None and ep_size != dist.get_world_size():
        raise ValueError(
            f"ep_size {ep_size} is not the default group's size " f"{dist.get_world_size()}: pass ep_group"
        )
    if ep_group is not None and dist.get_rank(ep_group) != ep_rank:
        raise ValueError(f"ep_rank {ep_rank} is rank {dist.get_rank(ep_group)} of ep_group")
    if ep_rank == 0 and updater is None:
        raise ValueError("EP rank 0 sends the stage: it needs a DistributedUpdater")

    ep = _EpGroup(ep_group, ep_rank, ep_size)
    dense, experts, error = _split(
        named_tensors, num_experts=num_experts, ep_size=ep_size, ep_rank=ep_rank, index=expert_index
    )
    refused, offers, gather = ep.negotiate(error, experts, gather)
    if ep_rank != 0:
        return ep.send_own_experts(experts, refused)
    remote, pending = ep.post_receives(offers, refused)
    source = _StageSource(updater, stage, dense + experts + remote, pending, refused, gather)
    failure = None
    try:
        if refused is not None and stages == 1:
            raise InputError(refused)  # nothing was sent: no session to open
        if gather == "whole":
            source.drain()  # before the session opens: the engines are not paused meanwhile
        return run_stages(
            updater, source.send, stage=stage, stages=stages, group=sources_group, version=version
        )
    except BaseException as e:
        failure = f"{type(e).__name__}: {e}"
        raise
    finally:
        # 3. Every receive completes (the other EP ranks' sends with it), then they learn the
        # outcome: None when the update committed.
        try:
            source.drain()
        finally:
            ep.broadcast([failure])


class _EpGroup:
    """This rank's place in the EP group: the object messages of the update's three steps."""

    def __init__(self, group, rank, size):
        self.group, self.rank, self.size = group, rank, size

    def peer(self, r):
        import torch.distributed as dist

        return r if self.group is None else dist.get_global_rank(self.group, r)

    def broadcast(self, objects):
        import torch.distributed as dist

        dist.broadcast_object_list(objects, src=self.peer(0), group=self.group)
        return objects[0]

    def negotiate(self, error, experts, gather):
        """1. What each EP rank sends, to the source; the source's verdict, to every EP rank.
        Returns (refusal or None, the offers on the source, the gather mode)."""
        import torch.distributed as dist

        metas = []
        if error is None and self.rank != 0:
            try:
                metas = [_meta(name, t) for name, t in experts]
            except TypeError as e:
                error = f"EP rank {self.rank}: {e}"
        host = socket.gethostname()
        offers = [None] * self.size if self.rank == 0 else None
        dist.gather_object((error, metas, host), offers, dst=self.peer(0), group=self.group)
        verdict = [None]
        if self.rank == 0:
            verdict[0] = next((e for e, _, _ in offers if e is not None), None)
            gather = _pick_gather(gather, host, [h for _, _, h in offers])
        return self.broadcast(verdict), offers, gather

    def send_own_experts(self, experts, refused):
        """2. A non-source rank: its own experts, one message each, then the stage's outcome."""
        import torch.distributed as dist

        works = []
        if refused is None:
            for i, data in enumerate(_as_bytes(t) for _, t in experts):
                if data.numel():
                    works.append(dist.isend(data, dst=self.peer(0), group=self.group, tag=i))
            for w in works:
                w.wait()
        outcome = self.broadcast([None])
        if refused is not None:
            raise InputError(refused)
        if outcome is not None:
            raise UpdateError(outcome)
        return None

    def post_receives(self, offers, refused):
        """2. The source: a buffer per remote expert, every receive posted at once. Returns the
        remote (name, tensor) pairs and {name: Work of its receive}."""
        import torch
        import torch.distributed as dist

        pending, remote = {}, []
        if refused is not None:
            return remote, pending
        for r in range(1, self.size):
            for i, (name, dtype, shape, nbytes) in enumerate(offers[r][1]):
                dt = getattr(torch, dtype)
                if nbytes == 0:
                    remote.append((name, torch.empty(shape, dtype=dt)))
                    continue
                buf = torch.empty(nbytes, dtype=torch.uint8)
                pending[name] = dist.irecv(buf, src=self.peer(r), group=self.group, tag=i)
                remote.append((name, buf.view(dt).view(shape)))
        return remote, pending


class _StageSource:
    """The source's stage: its tensors, with the remote experts' receives still in flight."""

    def __init__(self, updater, stage, tensors, pending, refused, gather):
        self.updater, self.stage, self.tensors = updater, stage, tensors
        self.pending, self.refused, self.gather = pending, refused, gather

    def arrived(self, name):
        # send_stage() calls this once per tensor: each receive is waited for once (a Gloo
        # receive waited for twice never returns).
        work = self.pending.pop(name, None)
        if work is not None:
            work.wait()

    def drain(self):
        while self.pending:
            self.arrived(next(iter(self.pending)))

    def send(self, token):
        if self.refused is not None:
            # A stage that fails before its first bucket, with the reason, so that the other
            # stage sources and the coordinator abort the session as for any failed stage.
            def refuse(name):
                raise InputError(self.refused)

            return self.updater.send_stage(token, self.stage, self.tensors, await_tensor=refuse)
        if self.gather == "whole":
            return self.updater.send_stage(token, self.stage, self.tensors)
        return self.updater.send_stage(token, self.stage, self.tensors, await_tensor=self.arrived)
