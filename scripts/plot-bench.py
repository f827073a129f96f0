#!/usr/bin/env python3
"""Draws weightcast-bench results (--json FILE) as PNG plots.

    scripts/plot-bench.py RESULT.json [MORE.json ...] --out DIR

- broadcast results: bandwidth (GB/s) against size, one line per backend (gloo-chain,
  gloo-stock, mpi-bcast, nccl), log-scaled size axis;
- update results: seconds per update step against the raw chain broadcast of the same bytes
  (a horizontal line), with #wrong printed in the title;
- hosts results: GB/s of each row as a bar, with the link rate as a line; with sharded rows
  (--shard-tps), also DIR/<input name>-shard.png: seconds per broadcast against TP size, full
  broadcast and sharded; with sharded update rows (--shard-update-tps), also
  DIR/<input name>-shard-update.png: seconds per update (mean of steps 2..) against TP size, full
  and sliced.
Writes DIR/<input name>.png for each input. Needs python3-matplotlib (Debian package).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_broadcast(result, ax):
    by_backend = {}
    for row in result["rows"]:
        by_backend.setdefault(row["backend"], []).append((row["size(B)"], row["algbw(GB/s)"]))
    for backend, points in sorted(by_backend.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=backend)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per broadcast")
    ax.set_ylabel("algbw = busbw (GB/s)")
    wrong = sum(row["#wrong"] for row in result["rows"])
    ax.set_title(f"broadcast bandwidth (#wrong {wrong})")
    ax.legend()


def plot_update(result, ax):
    steps = [r for r in result["rows"] if r["step"] != "raw"]
    raw = [r for r in result["rows"] if r["step"] == "raw"]
    ax.bar([r["step"] for r in steps], [r["seconds"] for r in steps], label="update (pause..continue)")
    if raw:
        ax.axhline(raw[0]["seconds"], color="black", linestyle="--", label="raw chain, same bytes")
    ax.set_xlabel("update step")
    ax.set_ylabel("seconds")
    wrong = sum(r["#wrong"] for r in steps)
    ax.set_title(f"end-to-end update against the raw broadcast (#wrong {wrong})")
    ax.legend()


def plot_hosts(result, ax):
    rows = result["rows"]
    ax.bar([r["what"] for r in rows], [r["algbw(GB/s)"] for r in rows])
    if rows:
        link = rows[0]["algbw(GB/s)"] / rows[0]["x link rate"]
        ax.axhline(link, color="black", linestyle="--", label=f"link rate {link:.3f} GB/s")
    ax.set_ylabel("GB/s")
    ax.set_title("shaped links (network namespaces)")
    ax.tick_params(axis="x", labelrotation=20)
    ax.legend()


def plot_hosts_shard(result, ax):
    """Seconds per broadcast against TP size; False when the run had no sharded rows."""
    rows = result["rows"]
    full = [r for r in rows if r["what"] == "full broadcast"]
    sharded = [
        (int(r["what"].split("-")[1]), r["time(us)"] / 1e6)
        for r in rows
        if r["what"].startswith("sharded TP-")
    ]
    if not full or not sharded:
        return False
    sharded.sort()
    tps = [tp for tp, _ in sharded]
    ax.plot(
        tps,
        [full[0]["time(us)"] / 1e6] * len(tps),
        marker="o",
        label="full broadcast (every rank, whole tensors)",
    )
    ax.plot(tps, [s for _, s in sharded], marker="o", label="sharded (each rank its slice)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(tps, [str(tp) for tp in tps])
    ax.set_xlabel("engine TP size (ranks, a shaped link each)")
    ax.set_ylabel("seconds per broadcast")
    ax.set_ylim(bottom=0)
    wrong = sum(r["#wrong"] for r in rows if r in full or r["what"].startswith("sharded TP-"))
    ax.set_title(f"shard-aware vs full broadcast, {full[0]['bytes'] / 2**20:.0f} MiB (#wrong {wrong})")
    ax.legend()
    return True


def plot_hosts_shard_update(result, ax):
    """Seconds per update (mean of steps 2..) against TP size, full and sliced; False when the
    run had no sharded update rows ("upd full tpN sK", "upd sliced tpN sK")."""
    means = {}  # (mode, tp) -> [seconds of steps 2..]
    wrong = 0
    for r in result["rows"]:
        words = r["what"].split()
        if len(words) != 4 or words[0] != "upd":
            continue
        wrong += r["#wrong"]
        if int(words[3][1:]) >= 2:
            means.setdefault((words[1], int(words[2][2:])), []).append(r["time(us)"] / 1e6)
    if not means:
        return False
    for mode, label in (
        ("full", "full (every rank, whole tensors)"),
        ("sliced", "sliced (each rank its slice)"),
    ):
        points = sorted((tp, sum(v) / len(v)) for (m, tp), v in means.items() if m == mode)
        ax.plot([tp for tp, _ in points], [s for _, s in points], marker="o", label=label)
    tps = sorted({tp for _, tp in means})
    ax.set_xscale("log", base=2)
    ax.set_xticks(tps, [str(tp) for tp in tps])
    ax.set_xlabel("engine TP size (ranks, a shaped link each)")
    ax.set_ylabel("seconds per update (mean of steps 2..)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"whole update, weightcast-train to torch engines, sliced vs full (#wrong {wrong})")
    ax.legend()
    return True


PLOTTERS = {"broadcast": plot_broadcast, "update": plot_update, "hosts": plot_hosts}
EXTRA = {"hosts": [("shard", plot_hosts_shard), ("shard-update", plot_hosts_shard_update)]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="weightcast-bench --json files")
    p.add_argument("--out", default=".", help="folder for the PNG files")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for path in args.results:
        with open(path) as f:
            result = json.load(f)
        plotter = PLOTTERS.get(result.get("mode"))
        if plotter is None:
            print(f"plot-bench: {path}: unknown mode {result.get('mode')!r}", file=sys.stderr)
            return 2
        stem = os.path.join(args.out, os.path.splitext(os.path.basename(path))[0])
        draw(plotter, result, stem + ".png")
        for suffix, extra in EXTRA.get(result["mode"], []):
            draw(extra, result, f"{stem}-{suffix}.png")
    return 0


def draw(plotter, result, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if plotter(result, ax) is not False:
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        print(out)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
