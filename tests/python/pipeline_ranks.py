"""One pipeline stage's source per process, under mpirun (tests/python/test_pipeline.py starts
it): rank r is stage r's source; torch.distributed (gloo, file:// rendezvous) moves the session
token and the stage results. Engines: $WEIGHTCAST_URLS (comma-separated), started by the test.

Three updates: the building blocks by hand (open_session / send_stage / gather / finish, verified),
then weightcast.pipeline_update, then a pipeline_update whose last stage has bad input, which
must leave every engine on the previous version's bytes. Prints "rank R ok" when all held."""

import os
import pickle

import torch
import torch.distributed as dist
import xxhash

import weightcast

import engines

RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
SIZE = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
URLS = os.environ["WEIGHTCAST_URLS"].split(",")


def stage_tensors(stage, step):
    """Stage `stage`'s tensors at `step`: any rank can rebuild any stage's (for the checks)."""
    g = torch.Generator().manual_seed(100 * step + stage)
    return {
        f"model.layers.{stage}.attn.weight": torch.randn(48, 64, generator=g).to(torch.bfloat16),
        f"model.layers.{stage}.mlp.weight": torch.randn(96, 40, generator=g),
        f"model.layers.{stage}.bias": torch.randint(-9, 9, (33,), generator=g, dtype=torch.int8),
    }


def expected(step):
    out = {}
    for s in range(SIZE):
        for name, t in stage_tensors(s, step).items():
            out[name] = xxhash.xxh3_128(
                t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            ).hexdigest()
    return out


def check_engines(step, version):
    engines.assert_engines_hold(URLS, expected(step), version)


def by_hand(updater):
    """The building blocks, as a trainer with its own collectives would use them."""
    box = [updater.open_session(version="pp-1") if RANK == 0 else None]
    dist.broadcast_object_list(box, src=0)
    token = box[0]
    result = None
    for s in range(SIZE):  # the stages send one after another
        if s == RANK:
            result = updater.send_stage(token, s, stage_tensors(s, 1).items())
            assert result.ok, result.error
            assert pickle.loads(pickle.dumps(result)).to_json() == result.to_json()
        dist.barrier()
    gathered = [None] * SIZE if RANK == 0 else None
    dist.gather_object(result, gathered, dst=0)
    if RANK == 0:
        report = updater.finish(token, gathered)
        assert report.ok and report.verified, report
        assert report.version == "pp-1" and report.tensors == 3 * SIZE, report
        check_engines(1, "pp-1")


def helper(updater):
    report = weightcast.pipeline_update(
        updater, stage_tensors(RANK, 2).items(), stage=RANK, stages=SIZE, version="pp-2"
    )
    if RANK == 0:
        assert report.ok and report.verified and report.tensors == 3 * SIZE, report
        check_engines(2, "pp-2")
    else:
        assert report is None


def failing_last_stage(updater):
    tensors = list(stage_tensors(RANK, 3).items())
    if RANK == SIZE - 1:
        tensors.append(tensors[0])  # a duplicate name: refused before this stage sends
    try:
        weightcast.pipeline_update(updater, tensors, stage=RANK, stages=SIZE, version="pp-3")
    except weightcast.InputError as e:
        assert RANK == 0 and "duplicate" in str(e), e
    except weightcast.UpdateError as e:
        assert RANK != 0 and "duplicate" in str(e), e
    else:
        raise AssertionError("an update with a bad stage committed")
    if RANK == 0:
        check_engines(2, "pp-2")  # the earlier stages' bytes were dropped with the session


def main():
    dist.init_process_group(
        "gloo", init_method=os.environ["WEIGHTCAST_RENDEZVOUS"], rank=RANK, world_size=SIZE
    )
    # Every stage source creates the same updater: same engines in the same order, same selector.
    with weightcast.DistributedUpdater(
        engines=URLS, selector="target", verify=True, bucket_bytes=8 << 10
    ) as updater:
        by_hand(updater)
        helper(updater)
        failing_last_stage(updater)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    engines.run_rank(main, RANK)
