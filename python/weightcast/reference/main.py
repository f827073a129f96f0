"""The reference engine's command line: python -m weightcast.reference (see the package's doc)."""

import argparse
import json
import os
import sys

from . import __doc__ as package_doc
from . import guard


def _plan_fault(text):
    kind, _, name = text.partition(":")
    if kind not in ("hole", "overlap") or not name:
        raise argparse.ArgumentTypeError(f"'{text}': expected hole:NAME or overlap:NAME")
    return text


def _names(text):
    names = [n for n in text.split(",") if n]
    if not names:
        raise argparse.ArgumentTypeError(f"'{text}': expected a comma-separated list")
    return names


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m weightcast.reference", description=package_doc.split("\n\n")[0]
    )
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel worker processes")
    p.add_argument("--model", default="tiny", help="weightcast model preset (sync/model/model.h)")
    p.add_argument(
        "--ep",
        type=int,
        default=1,
        help="expert-parallel ranks of an MoE model's experts (divides --tp; EP rank p holds the "
        "p-th block of experts, split over its tp/ep TP ranks)",
    )
    p.add_argument(
        "--num-layers", type=int, help="override the preset's num_hidden_layers (as weightcast-train's)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights (the trainer's --seed)")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (beyond loopback: needs --token)"
    )
    p.add_argument("--port", type=int, default=0, help="0: an ephemeral port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--token", default="", help="bearer token required on every route but /health")
    p.add_argument(
        "--max-body-bytes",
        type=guard.parse_bytes,
        default="64M",
        help="largest HTTP body accepted (K/M/G suffixes)",
    )
    p.add_argument(
        "--http-timeout-ms",
        type=guard.positive_int,
        default=30000,
        help="HTTP socket read/write timeout, and the most one request (head and body) may take to arrive",
    )
    p.add_argument("--no-draft", action="store_true", help="serve no EAGLE-style draft")
    p.add_argument(
        "--delta",
        action="store_true",
        help="keep the last committed tensors on the host so delta buckets apply",
    )
    p.add_argument(
        "--legacy-finalize",
        action="store_true",
        help="the old behaviour: post-process every covered runner at the end of a session",
    )
    p.add_argument("--bind-address", default="127.0.0.1", help="data-plane address of the workers")
    p.add_argument(
        "--worker-netns",
        type=_names,
        help="benchmarks (root): worker k runs in the k-th of these network namespaces "
        "(comma separated, one per worker, as `ip netns` names them), as a TP worker on a host "
        "of its own; needs --worker-bind-addresses and --tp-host reachable from them (the TP "
        "group's Gloo picks its interface as torch does: GLOO_SOCKET_IFNAME)",
    )
    p.add_argument(
        "--worker-bind-addresses",
        type=_names,
        help="with --worker-netns: worker k's data-plane address (comma separated)",
    )
    p.add_argument(
        "--tp-host",
        default="127.0.0.1",
        help="address of the workers' TP-group store, which this process binds (an address of this "
        "host; the store has no authentication: one only the workers reach)",
    )
    p.add_argument("--store-token", default=None)
    p.add_argument("--init-timeout", type=float, default=60.0)
    p.add_argument("--comm-timeout", type=float, default=60.0)
    p.add_argument(
        "--session-timeout",
        type=float,
        default=60.0,
        help="abort a session (and lift a pause) idle this many seconds",
    )
    p.add_argument(
        "--api",
        choices=("weightcast", "sglang", "vllm"),
        default="weightcast",
        help="control-plane routes: weightcast's (with SGLang's names); sglang: the same "
        "routes, /server_info in SGLang's shape with the plug-in's announce; vllm: "
        "vLLM's dev-mode weight-transfer routes",
    )
    p.add_argument(
        "--shard-plan",
        choices=("none", "recorded"),
        default="none",
        help="announce each worker's shard plan in /server_info (docs/sharding.md); recorded: "
        "from the model's own load_weights on placeholder tensors",
    )
    p.add_argument(
        "--shard-plan-fault",
        metavar="KIND:NAME",
        type=_plan_fault,
        help="test hook: rank 0's announced plan is wrong on tensor NAME; KIND hole: it leaves "
        "NAME out; overlap: its slice of NAME reaches one index into rank 1's",
    )
    p.add_argument("--debug-routes", action="store_true", help="test hooks under /debug/")
    return p.parse_args(argv)


def config(a):
    """The engine's configuration (shared with every worker) from the parsed arguments."""
    model = a.model
    if a.num_layers:
        from .model import model_spec

        spec = model_spec(a.model)
        spec["num_hidden_layers"] = a.num_layers
        model = json.dumps(spec)
    return {
        "tp": a.tp,
        "ep": a.ep,
        "model": model,
        "seed": a.seed,
        "draft": not a.no_draft,
        "delta": a.delta,
        "legacy_finalize": a.legacy_finalize,
        "bind_address": a.bind_address,
        "tp_host": a.tp_host,
        "worker_netns": a.worker_netns,
        "worker_bind_addresses": a.worker_bind_addresses,
        "store_token": a.store_token,
        "init_timeout": a.init_timeout,
        "comm_timeout": a.comm_timeout,
        "session_timeout": a.session_timeout,
        "debug_routes": a.debug_routes,
        "api": a.api,
        "shard_plan": a.shard_plan,
        "shard_plan_fault": a.shard_plan_fault,
    }


def write_port_file(path, port):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


def main(argv=None):
    a = parse_args(argv)
    if a.ep < 1 or a.tp % a.ep:
        print(f"weightcast.reference: --ep {a.ep} must be at least 1 and divide --tp {a.tp}", file=sys.stderr)
        return 2
    for flag, names in (
        ("--worker-netns", a.worker_netns),
        ("--worker-bind-addresses", a.worker_bind_addresses),
    ):
        if names is not None and len(names) != a.tp:
            print(f"weightcast.reference: {flag} names {len(names)}, --tp is {a.tp}", file=sys.stderr)
            return 2
    if (a.worker_netns is None) != (a.worker_bind_addresses is None):
        print("weightcast.reference: --worker-netns and --worker-bind-addresses go together", file=sys.stderr)
        return 2
    refusal = guard.bind_refusal(a.host, a.token)
    if refusal:
        print(f"weightcast.reference: {refusal}", file=sys.stderr, flush=True)
        return 2
    # Imported once the command line is accepted (the compiled module); only the workers, which
    # Engine starts, import torch.
    from .. import ConfigError
    from .engine import Engine
    from .routes import route_table
    from .server import make_server

    try:
        engine = Engine(config(a))
    except (ConfigError, RuntimeError) as e:  # the store's address, or a worker that did not start
        print(f"weightcast.reference: {e}", file=sys.stderr, flush=True)
        return 1
    guards = {"token": a.token, "max_body_bytes": a.max_body_bytes, "read_timeout": a.http_timeout_ms / 1000}
    server = make_server(engine, route_table(engine), a.host, a.port, **guards)
    port = server.server_address[1]
    if a.port_file:
        write_port_file(a.port_file, port)
    print(
        f"weightcast.reference: serving on http://{a.host}:{port} (tp {a.tp}, model {a.model}, api {a.api})",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        engine.workers.close()
