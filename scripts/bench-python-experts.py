"""Benchmark rows: weightcast.expert_parallel_update from EP ranks that each hold only their
experts, against one Python source holding the whole model, in the same run.

    PYTHONPATH=build/python python3 scripts/bench-python-experts.py \\
        --engine build/launcher/engine/weightcast-engine [--model moe-small] [--ep "2 4"] \\
        [--steps 4] [--bucket-bytes 64M] [--engines 1]

Starts the engines (the model's tensors read from the first one), then per EP size runs
`mpirun -np EP` of this script. In every run each step updates the engines three ways, in turn:
`single` (EP rank 0 holds the whole model and calls updater.update()), `overlap`
(expert_parallel_update, the other EP ranks' experts received while the source sends) and `whole`
(the same, every expert received before the first bucket). Prints one row per EP size and way:
mean seconds and GB/s of steps 2..N and the ratio to `single`. A benchmark, not a test.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request

LISTENING = "weightcast-engine listening on "
WAYS = ("single", "overlap", "whole")


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def start_engine(binary, model):
    argv = [binary, "--port", "0", "--model", model, "--seed", "1", "--target-layout", "none"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith(LISTENING):
            return proc, line[len(LISTENING) :].split()[0].rstrip("/")
    proc.kill()
    raise SystemExit("engine did not start: " + " ".join(argv))


def drive(args):
    procs, urls = [], []
    try:
        for _ in range(args.engines):
            proc, url = start_engine(args.engine, args.model)
            procs.append(proc)
            urls.append(url)
        mpi = [
            os.environ.get("WEIGHTCAST_MPIEXEC", "mpirun"),
            *shlex.split(
                os.environ.get("WEIGHTCAST_MPIRUN_FLAGS", "")
                or subprocess.run(
                    ["bash", "scripts/mpirun-flags.sh"], capture_output=True, text=True, check=True
                ).stdout
            ),
        ]
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        print(
            f"# {args.model}, {args.engines} engine(s) x 1 rank, gloo on loopback, bucket "
            f"{args.bucket_bytes}, {args.steps} steps per way (mean of steps 2..{args.steps}); "
            f"load: {load}"
        )
        print(f"{'ep':>3} {'way':<8} {'seconds':>8} {'GB/s':>7} {'vs single':>9}")
        for ep in args.ep.split():
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(
                    os.environ,
                    WEIGHTCAST_URLS=",".join(urls),
                    WEIGHTCAST_RENDEZVOUS="file://" + os.path.join(tmp, "rendezvous"),
                    WEIGHTCAST_BENCH=json.dumps({"steps": args.steps, "bucket": args.bucket_bytes}),
                )
                run = subprocess.run(
                    [
                        *mpi,
                        "-np",
                        ep,
                        "-x",
                        "PYTHONPATH",
                        "-x",
                        "WEIGHTCAST_URLS",
                        "-x",
                        "WEIGHTCAST_RENDEZVOUS",
                        "-x",
                        "WEIGHTCAST_BENCH",
                        sys.executable,
                        os.path.abspath(__file__),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
            rows = [line for line in run.stdout.splitlines() if line.startswith("{")]
            if run.returncode != 0 or not rows:
                raise SystemExit(f"ep {ep} failed:\n{run.stdout}\n{run.stderr}")
            result = json.loads(rows[-1])
            base = result["single"]["seconds"]
            for way in WAYS:
                r = result[way]
                print(f"{ep:>3} {way:<8} {r['seconds']:8.3f} {r['gbps']:7.3f} " f"{base / r['seconds']:9.2f}")
        with open("/proc/loadavg") as f:
            print("# load after: " + " ".join(f.read().split()[:3]))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def rank_main():
    import torch
    import torch.distributed as dist

    import weightcast
    from weightcast.experts import expert_of, local_experts, with_expert_index

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    urls = os.environ["WEIGHTCAST_URLS"].split(",")
    conf = json.loads(os.environ["WEIGHTCAST_BENCH"])
    with urllib.request.urlopen(f"{urls[0]}/server_info", timeout=30) as r:
        num_experts = json.load(r)["runners"][0]["model"]["num_experts"]
    with urllib.request.urlopen(f"{urls[0]}/weights_checksum?runner=target", timeout=60) as r:
        tensors = [(t["name"], t["dtype"], t["shape"]) for t in json.load(r)["tensors"]]
    dist.init_process_group(
        "gloo", init_method=os.environ["WEIGHTCAST_RENDEZVOUS"], rank=rank, world_size=size
    )
    mine = local_experts(num_experts, size, rank)
    g = torch.Generator().manual_seed(rank)

    def make(dtype, shape):
        return torch.randn(*shape, generator=g).to(getattr(torch, dtype))

    held, everything, model_bytes = [], [], 0
    for name, dtype, shape in tensors:
        e = expert_of(name)
        ours = e in mine if e is not None else rank == 0
        if ours or rank == 0:
            t = make(dtype, shape)
            model_bytes += t.numel() * t.element_size()
            if rank == 0:
                everything.append((name, t))
            if ours:
                held.append((name if e is None else with_expert_index(name, e - mine.start), t))
    updater = None
    if rank == 0:
        updater = weightcast.DistributedUpdater(
            engines=urls, selector="target", bucket_bytes=parse_bytes(conf["bucket"])
        )
    times = {way: [] for way in WAYS}
    for step in range(conf["steps"]):
        for way in WAYS:
            dist.barrier()
            start = time.perf_counter()
            if way == "single":
                if rank == 0:
                    updater.update(everything)
            else:
                weightcast.expert_parallel_update(
                    updater, held, ep_rank=rank, ep_size=size, num_experts=num_experts, gather=way
                )
            if step > 0:
                times[way].append(time.perf_counter() - start)
    dist.barrier()
    if rank == 0:
        out = {}
        for way, ts in times.items():
            s = sum(ts) / len(ts)
            out[way] = {"seconds": s, "gbps": model_bytes / s / 1e9}
        print(json.dumps(out), flush=True)
        updater.close()
    dist.destroy_process_group()


def main():
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        return rank_main()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", required=True, help="the weightcast-engine binary")
    p.add_argument("--model", default="moe-small")
    p.add_argument("--ep", default="2 4", help="EP sizes, space separated")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--bucket-bytes", default="64M")
    p.add_argument("--engines", type=int, default=1)
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be at least 2 (step 1 is not counted)")
    drive(args)


if __name__ == "__main__":
    main()
