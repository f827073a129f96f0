"""One expert-parallel rank per process, under mpirun (tests/python/test_experts.py starts it).

WEIGHTCAST_LAYOUT says how the ranks are arranged:
- "ep" (2 processes): one stage, EP 2. EP rank 0 holds the dense tensors and experts [0, E/2),
  EP rank 1 experts [E/2, E); the default group is the EP group.
- "pp-ep" (4 processes): two pipeline stages of EP 2 each. World rank 2 * stage + ep_rank; the
  stage sources (world ranks 0 and 2) form their own group.
Engines: $WEIGHTCAST_URLS (comma-separated), started by the test with the moe-tiny model, whose
tensors (names, dtypes, shapes) the ranks read from the first engine.

Updates: the overlapped gather with local expert indices; the whole gather with global indices;
then an EP rank offering an expert it does not hold, which every rank must see refused and which
must leave the engines on the previous version's bytes. After each committed update every tensor
the engines hold, every expert included, is checked bit for bit against digests computed here
with torch. Prints "rank R ok" when all held."""

import json
import os
import urllib.request

import torch
import torch.distributed as dist
import xxhash

import weightcast

import engines

RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
SIZE = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
URLS = os.environ["WEIGHTCAST_URLS"].split(",")
LAYOUT = os.environ.get("WEIGHTCAST_LAYOUT", "ep")

EP = 2
STAGES = SIZE // EP
EXPERTS = 8  # the engines' model: moe-tiny (2 layers of 8 experts)
LAYERS = 2


def engine_tensors():
    """(name, dtype, shape) of every tensor the engines' target runner holds."""
    with urllib.request.urlopen(f"{URLS[0]}/weights_checksum?runner=target", timeout=30) as r:
        body = json.load(r)
    return sorted((t["name"], t["dtype"], tuple(t["shape"])) for t in body["tensors"])


TENSORS = None


def stage_of(name):
    """Layers split evenly over the stages; the embeddings first, the final norm and head last."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        return int(parts[2]) * STAGES // LAYERS
    return 0 if "embed_tokens" in name else STAGES - 1


def stage_model(stage, step):
    """The full HF state dict of stage `stage` at `step` (any rank can rebuild any stage's)."""
    out = {}
    for i, (name, dtype, shape) in enumerate(TENSORS):
        if stage_of(name) != stage:
            continue
        g = torch.Generator().manual_seed(100000 * step + i)
        out[name] = torch.randn(*shape, generator=g).to(getattr(torch, dtype))
    return out


def held_by(stage, ep_rank, step, index):
    """What EP rank `ep_rank` of `stage` holds and passes: rank 0 everything but the other ranks'
    experts; the others only their experts (and, to show they are ignored, a stale dense copy)."""
    per = EXPERTS // EP
    out = []
    for name, t in stage_model(stage, step).items():
        e = weightcast.experts.expert_of(name)
        if e is None:
            out.append((name, t if ep_rank == 0 else torch.zeros_like(t)))
        elif ep_rank * per <= e < (ep_rank + 1) * per:
            local = e - ep_rank * per if index == "local" else e
            out.append((weightcast.experts.with_expert_index(name, local), t))
    return out


def digest(t):
    return xxhash.xxh3_128(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def check_engines(step, version):
    want = {}
    for s in range(STAGES):
        want.update({name: digest(t) for name, t in stage_model(s, step).items()})
    experts = sum(1 for n in want if weightcast.experts.expert_of(n) is not None)
    assert experts == LAYERS * EXPERTS * 3 and len(want) == len(TENSORS), (experts, len(want))
    engines.assert_engines_hold(URLS, want, version)


def update(updater, groups, step, version, index="local", gather="overlap"):
    stage, ep_rank, ep_group, sources = groups
    return weightcast.expert_parallel_update(
        updater,
        held_by(stage, ep_rank, step, index),
        ep_rank=ep_rank,
        ep_size=EP,
        num_experts=EXPERTS,
        ep_group=ep_group,
        expert_index=index,
        stage=stage,
        stages=STAGES,
        sources_group=sources,
        version=version,
        gather=gather,
    )


def make_groups():
    if LAYOUT == "ep":
        assert SIZE == EP, SIZE
        return 0, RANK, None, None
    assert LAYOUT == "pp-ep" and SIZE == 2 * EP, (LAYOUT, SIZE)
    stage, ep_rank = divmod(RANK, EP)
    # Every rank creates every group, in the same order, as torch.distributed requires.
    ep_groups = [dist.new_group([s * EP + r for r in range(EP)]) for s in range(STAGES)]
    sources = dist.new_group([s * EP for s in range(STAGES)])
    return stage, ep_rank, ep_groups[stage], sources


def main():
    global TENSORS
    TENSORS = engine_tensors()
    dist.init_process_group(
        "gloo", init_method=os.environ["WEIGHTCAST_RENDEZVOUS"], rank=RANK, world_size=SIZE
    )
    groups = make_groups()
    stage, ep_rank = groups[0], groups[1]
    coordinator = stage == 0 and ep_rank == 0
    # Only each stage's source (EP rank 0) talks to the engines.
    updater = None
    if ep_rank == 0:
        updater = weightcast.DistributedUpdater(
            engines=URLS, selector="target", verify=True, bucket_bytes=16 << 10
        )
    try:
        report = update(updater, groups, 1, "ep-1")
        if coordinator:
            assert report.ok and report.verified, report
            assert report.tensors == len(stage_model(0, 1)) + (
                len(stage_model(1, 1)) if STAGES > 1 else 0
            ), report
            check_engines(1, "ep-1")
        else:
            assert report is None

        report = update(updater, groups, 2, "ep-2", index="global", gather="whole")
        if coordinator:
            assert report.ok and report.verified, report
            check_engines(2, "ep-2")

        # The last stage's EP rank 1 names a local expert it cannot hold.
        bad = stage == STAGES - 1 and ep_rank == EP - 1
        tensors = held_by(stage, ep_rank, 3, "local")
        if bad:
            tensors.append(("model.layers.0.mlp.experts.7.up_proj.weight", tensors[0][1]))
        try:
            weightcast.expert_parallel_update(
                updater,
                tensors,
                ep_rank=ep_rank,
                ep_size=EP,
                num_experts=EXPERTS,
                ep_group=groups[2],
                stage=stage,
                stages=STAGES,
                sources_group=groups[3],
                version="ep-3",
            )
        except (weightcast.InputError, weightcast.UpdateError) as e:
            assert "local expert 7" in str(e), e
        else:
            raise AssertionError("an update with a refused EP rank committed")
        if coordinator:
            check_engines(2, "ep-2")
        dist.barrier()
    finally:
        if updater is not None:
            updater.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    engines.run_rank(main, RANK)
