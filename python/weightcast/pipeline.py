"""One atomic update of a pipeline-parallel model, over torch.distributed.

Every stage's source rank (tensor-parallel rank 0, data-parallel rank 0 of the stage) calls

    report = weightcast.pipeline_update(updater, stage_tensors, stage=pp_rank, stages=pp_size,
                                        group=sources_group)

with its own stage's (name, tensor) pairs; `group` holds exactly the stage sources, ranked by
stage (None: the default group, whose rank r is stage r's source). Stage 0's source is the
coordinator: it opens the session, the stages send one after another, and it commits only if
every stage succeeded. The coordinator gets the UpdateReport; the others get None; on failure
every source raises (the coordinator the precise exception, the others UpdateError naming it).

The same steps with another transport (mpi4py, your own store) are the updater's methods:
open_session(), send_stage(), finish(), abort() (docs/python.md, "Under mpirun or torchrun").
"""

from ._weightcast import UpdateError


def pipeline_update(updater, named_tensors, *, stage, stages, group=None, version=None):
    return run_stages(
        updater,
        lambda token: updater.send_stage(token, stage, named_tensors),
        stage=stage,
        stages=stages,
        group=group,
        version=version,
    )


def run_stages(updater, send, *, stage, stages, group=None, version=None):
    """pipeline_update() with this stage's send_stage() call made by `send(token)` (which returns
    its StageResult): weightcast.expert_parallel_update() sends through it. With one stage nothing
    is exchanged, so the other ranks of the default group need not take part."""
    import torch.distributed as dist

    def source(s):
        return s if group is None else dist.get_global_rank(group, s)

    def share(value, s):
        if stages == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=source(s), group=group)
        return box[0]

    coordinator = stage == 0

    def agreed(what, action):
        # action() on the coordinator, its value shared with every source; each raises if it failed.
        outcome = None
        if coordinator:
            try:
                outcome = ("ok", action())
            except BaseException as e:
                share(("failed", f"{what} failed: {e}"), 0)
                raise
        status, value = share(outcome, 0)
        if status != "ok":
            raise UpdateError(value)
        return value

    token = agreed("opening the session", lambda: updater.open_session(version))

    results = []
    for s in range(stages):
        # Stage s + 1 starts once stage s has sent: the stages are serialized, as the engines'
        # session receives them; a failed stage stops the later ones from sending.
        mine = send(token) if s == stage else None
        result = share(mine, s)
        results.append(result)
        if not result.ok:
            break

    report = None

    def finish():
        # A failed last result makes finish() abort the session and raise its exception.
        nonlocal report
        report = updater.finish(token, results)
        return str(report)

    agreed("update", finish)
    return report
