"""Benchmark row: Python update() of a model vs `weightcast-bench update` of the same
configuration (engines, ranks, model shapes, bucket size, in-flight bound), in the same run.

    PYTHONPATH=build/python python3 scripts/bench-python-update.py --bench build/launcher/weightcast-bench

Prints both rows and the ratio. A benchmark, not a test: the numbers depend on the machine.
Both sides count an update as the C++ updater does (pause -> ... -> continue) over model bytes.
"""

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request

import torch

import weightcast

# sync/model/model.cc kLadder: (vocab, hidden, heads, kv_heads, head_dim, intermediate), bf16.
LADDER = [
    (4096, 256, 4, 2, 64, 768),
    (8192, 512, 8, 4, 64, 1536),
    (16384, 1024, 16, 8, 64, 3072),
    (32768, 2048, 16, 8, 128, 6144),
    (65536, 4096, 32, 8, 128, 12288),
]


def spec_bytes(v, h, nh, kv, hd, inter, layers):
    per_layer = 2 * h + (nh * hd + 2 * kv * hd) * h + h * nh * hd + 3 * inter * h
    return 2 * (2 * v * h + h + layers * per_layer)


def spec_for_bytes(target):
    """sync::model_spec_for_bytes: the widest shape fitting four layers, as many layers as fit."""
    chosen = LADDER[0]
    for shape in LADDER:
        if spec_bytes(*shape, 4) <= target:
            chosen = shape
    one = spec_bytes(*chosen, 1)
    layers = 1 + max(0, (target - one) // (spec_bytes(*chosen, 2) - one))
    v, h, nh, kv, hd, inter = chosen
    return {
        "vocab_size": v,
        "hidden_size": h,
        "num_hidden_layers": min(layers, 1024),
        "num_attention_heads": nh,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "intermediate_size": inter,
        "num_nextn_predict_layers": 0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def cpp_row(args):
    """seconds, GB/s and data-phase seconds of the C++ bench (rows from its --json table)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [
                args.bench,
                "update",
                "--engines",
                str(args.engines),
                "--model-bytes",
                args.model_bytes,
                "--bucket-bytes",
                args.bucket_bytes,
                "--max-in-flight",
                str(args.max_in_flight),
                "--iters",
                str(args.iters),
                "--no-raw",
                "--json",
                out.name,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows = json.load(open(out.name))["rows"]
    if not rows:
        raise SystemExit("weightcast-bench update printed no rows")
    seconds = sum(r["seconds"] for r in rows) / len(rows)
    data = sum(r["data(s)"] for r in rows) / len(rows)
    return seconds, sum(r["GB/s"] for r in rows) / len(rows), data


def start_engines(args, spec_path, model_bytes):
    """The engines weightcast-bench update starts (launcher/bench/update.cc update_engine_argv)."""
    engine = os.path.join(os.path.dirname(args.bench), "engine", "weightcast-engine")
    procs, urls = [], []
    for _ in range(args.engines):
        p = subprocess.Popen(
            [
                engine,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--ranks",
                "1",
                "--model",
                spec_path,
                "--seed",
                "1",
                "--max-bucket-bytes",
                str(max(parse_bytes(args.bucket_bytes), model_bytes)),
                "--chunk-bytes",
                str(4 << 20),
                "--comm-timeout-ms",
                "600000",
                "--session-timeout-ms",
                "600000",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
        urls.append(re.search(r"http://\S+", p.stdout.readline()).group(0))
    return procs, urls


def python_row(args):
    spec = spec_for_bytes(parse_bytes(args.model_bytes))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    shape = [
        spec[k]
        for k in (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
        )
    ]
    procs, urls = start_engines(args, f.name, spec_bytes(*shape, spec["num_hidden_layers"]))
    try:
        with urllib.request.urlopen(urls[0] + "/weights_checksum?runner=target") as r:
            metas = json.load(r)["tensors"]
        model = {t["name"]: torch.randn(t["shape"]).to(torch.bfloat16) for t in metas}
        with weightcast.DistributedUpdater(
            engines=urls,
            selector="target",
            bucket_bytes=parse_bytes(args.bucket_bytes),
            max_in_flight=args.max_in_flight,
            update_timeout=600,
            request_timeout=600,
            group_timeout=600,
        ) as updater:
            seconds, gbps, data, wall, size = [], [], [], [], 0
            for _ in range(args.iters):
                for t in model.values():
                    t.add_(1)  # a "training step" changes every weight in place
                start = time.perf_counter()
                report = updater.update(model.items())
                wall.append(time.perf_counter() - start)
                seconds.append(report.seconds)
                gbps.append(report.gbps)
                data.append(report.phases["data"])
                size = report.bytes
        n = len(seconds)
        return sum(seconds) / n, sum(gbps) / n, sum(data) / n, size, len(model), sum(wall) / n
    finally:
        for p in procs:
            p.kill()
            p.wait()
        os.unlink(f.name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="build/launcher/weightcast-bench")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--model-bytes", default="512M")
    parser.add_argument("--bucket-bytes", default="256M")
    parser.add_argument("--max-in-flight", type=int, default=3)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternate the two sides this many times; the best round counts"
    )
    args = parser.parse_args()
    py, cpp = [], []
    for _ in range(args.rounds):  # interleaved, so both sides see the same machine load
        py.append(python_row(args))
        time.sleep(1)
        cpp.append(cpp_row(args))
    py_s, py_gbps, py_data, size, count, py_wall = max(py, key=lambda r: r[1])
    cpp_s, cpp_gbps, cpp_data = max(cpp, key=lambda r: r[1])
    print(
        f"# update of a {size / (1 << 20):.0f} MiB model ({count} tensors), {args.engines} "
        f"engines, bucket {args.bucket_bytes}, gloo over loopback, avg of {args.iters} "
        f"updates, best of {args.rounds} interleaved rounds"
    )
    print(f"{'side':>8} {'seconds':>9} {'GB/s':>8} {'data(s)':>9}")
    print(f"{'python':>8} {py_s:9.3f} {py_gbps:8.3f} {py_data:9.3f}")
    print(f"{'c++':>8} {cpp_s:9.3f} {cpp_gbps:8.3f} {cpp_data:9.3f}")
    # Outside the report's window: capturing the pairs, group checks, the worker thread.
    print(f"# python update() call {py_wall:.3f} s wall vs report {py_s:.3f} s")
    for side, rows in (("python", py), ("c++", cpp)):
        print(f"# {side} rounds GB/s: " + " ".join(f"{r[1]:.3f}" for r in rows))
    print(f"# python / c++ throughput = {py_gbps / cpp_gbps:.2f}x")


if __name__ == "__main__":
    main()
