"""An engine that answers like an SGLang server and receives weights the way SGLang does.

Usage: sglang_style_engine.py --digests FILE [--fault none|fail_400|never_answer]
           [--fault-bucket K] [--no-sessions] [--timeout 60]

Prints "sglang-style engine listening on http://127.0.0.1:PORT" once it serves (an ephemeral
port it keeps). Routes and answer shapes are SGLang's (python/sglang/srt/entrypoints/
http_server.py): /get_server_info (no /server_info), /health and /health_generate with an empty
body, pause/continue answering {"message", "status"}, /flush_cache answering plain text,
init/destroy/update answering {"success", "message"}, /update_weight_version with new_version,
/get_weight_version and /model_info, /update_weights_from_disk, plus the begin/end_weight_update
routes Miles calls (--no-sessions: 404 there, as SGLang builds without the sessions branch that
slime drives). One
engine rank (tp_size 1). Joining a group is SGLang's init_custom_process_group (a torch worker
on the tcp:// store, PrefixStore(group_name), the group helper). A bucket request receives as
SGLang's update_weights_from_distributed does: one dist.broadcast per tensor in `names` order
(no load_format), or one broadcast of the unpadded flattened bucket (load_format
"flattened_bucket", the tensors' bytes back to back). Received tensors are loaded at once (SGLang
has no staging), and a bucket's weight_version becomes the engine's. At end_weight_update (with
--no-sessions: after every bucket) the XXH3-128 of every tensor held is written to --digests as
{"weight_version", "digests": {name: hex}}. /get_server_info also reports "stand_in": whether
generation is paused, how often it was continued, the model paths it reloaded from, and the
weight-update routes called in order (consecutive repeats once).

Faults, at bucket request K (0-based, counted over the engine's life): fail_400 receives (and
loads) the bucket, then answers 400 {"success": false} as SGLang does for a failed load;
never_answer receives, then never answers.
"""
import argparse
import datetime
import http.server
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import xxhash

from sglang_compat import connect_store, custom_group, release_group

SIZES = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
    "float8_e4m3fn": 1,
}


class State:
    def __init__(self, args):
        self.args = args
        self.version = "0"
        self.groups = {}  # name -> (store, pg)
        self.weights = {}  # name -> bytes
        self.buckets = 0
        self.paused = False
        self.continues = 0
        self.reloads = []
        self.calls = []  # the weight-update routes called, in order, consecutive repeats once
        self.lock = threading.Lock()

    def record(self, path):
        if path in (
            "/health",
            "/health_generate",
            "/server_info",
            "/get_server_info",
            "/get_weight_version",
            "/model_info",
            "/get_model_info",
        ):
            return
        with self.lock:
            if not self.calls or self.calls[-1] != path:
                self.calls.append(path)

    def write_digests(self):
        doc = {
            "weight_version": self.version,
            "digests": {n: xxhash.xxh3_128(b).hexdigest() for n, b in self.weights.items()},
        }
        tmp = self.args.digests + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.args.digests)


def nbytes(dtype, shape):
    size = SIZES[dtype]
    for d in shape:
        size *= d
    return size


def receive(state, body):
    _, pg = state.groups[body.get("group_name", "weight_update_group")]
    sizes = [nbytes(d, s) for d, s in zip(body["dtypes"], body["shapes"])]
    if body.get("load_format") == "flattened_bucket":
        flat = torch.empty(sum(sizes), dtype=torch.uint8)
        dist.broadcast(flat, src=0, group=pg)
        data, offset = flat.numpy().tobytes(), 0
        for name, size in zip(body["names"], sizes):
            state.weights[name] = data[offset : offset + size]
            offset += size
        return
    # Per tensor, as SGLang: allocate each, one async broadcast each, then wait for all.
    tensors = [torch.empty(size, dtype=torch.uint8) for size in sizes]
    works = [dist.broadcast(t, src=0, group=pg, async_op=True) for t in tensors]
    for w in works:
        w.wait()
    for name, t in zip(body["names"], tensors):
        state.weights[name] = t.numpy().tobytes()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Keep-alive clients get each answer at once: headers and body are separate writes, and
    # with Nagle's algorithm the body waited on the client's delayed ACK (tens of ms).
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type="application/json"):
        data = (json.dumps(body) if content_type == "application/json" else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self):
        s = self.server.state
        s.record(self.path)
        if self.path in ("/health", "/health_generate"):
            return self.reply(200, "", "text/plain")
        if self.path == "/get_server_info":
            return self.reply(
                200,
                {
                    "tp_size": 1,
                    "dp_size": 1,
                    "pp_size": 1,
                    "ep_size": 1,
                    "speculative_algorithm": None,
                    "weight_version": s.version,
                    "internal_states": [{"last_gen_throughput": 0.0}],
                    "version": "0.5.0-style",
                    "stand_in": {
                        "paused": s.paused,
                        "continues": s.continues,
                        "reloads": s.reloads,
                        "calls": s.calls,
                    },
                },
            )
        if self.path == "/get_weight_version":
            return self.reply(200, {"weight_version": s.version})
        if self.path in ("/model_info", "/get_model_info"):
            return self.reply(
                200, {"model_path": "style", "is_generation": True, "weight_version": s.version}
            )
        if self.path == "/flush_cache":
            return self.reply(
                200, "Cache flushed.\nPlease check backend logs for more details.\n", "text/plain"
            )
        return self.reply(404, {"detail": "Not Found"})

    def do_POST(self):
        self.server.state.record(self.path)
        try:
            self.post(self.server.state, self.body(), self.path)
        except Exception as e:  # SGLang answers a failed weight route with 400 and the reason
            self.reply(400, {"success": False, "message": f"{type(e).__name__}: {e}"})

    def post(self, s, body, path):
        if path == "/init_weights_update_group":
            old = s.groups.pop(body["group_name"], None)
            if old is not None:
                release_group(old[1])
            timeout = datetime.timedelta(seconds=s.args.timeout)
            store = connect_store(body["master_address"], body["master_port"], body["world_size"], timeout)
            pg = custom_group(
                store,
                body["world_size"],
                body["rank_offset"],
                body["group_name"],
                body.get("backend", "nccl"),
                timeout,
            )
            s.groups[body["group_name"]] = (store, pg)
            return self.reply(
                200, {"success": True, "message": "Succeeded to initialize custom process group."}
            )
        if path == "/destroy_weights_update_group":
            old = s.groups.pop(body.get("group_name", "weight_update_group"), None)
            if old is None:
                return self.reply(
                    400, {"success": False, "message": "The group to be destroyed does not exist."}
                )
            release_group(old[1])
            return self.reply(200, {"success": True, "message": "Succeeded to destroy."})
        if path == "/flush_cache":
            return self.reply(
                200, "Cache flushed.\nPlease check backend logs for more details.\n", "text/plain"
            )
        if path in ("/pause_generation", "/continue_generation"):
            pausing = path == "/pause_generation"
            s.paused = pausing
            s.continues += 0 if pausing else 1
            word = "paused" if pausing else "continued"
            return self.reply(200, {"message": f"Generation {word} successfully.", "status": "ok"})
        if path in ("/begin_weight_update", "/end_weight_update") and s.args.no_sessions:
            return self.reply(404, {"detail": "Not Found"})
        if path == "/begin_weight_update":
            return self.reply(200, {"success": True, "message": "begin"})
        if path == "/update_weights_from_disk":
            s.reloads.append(body["model_path"])
            s.weights = {}
            return self.reply(
                200,
                {
                    "success": True,
                    "message": "Succeeded to update model " "weights.",
                    "num_paused_requests": 0,
                },
            )
        if path == "/update_weights_from_distributed":
            with s.lock:  # SGLang serializes weight updates
                k = s.buckets
                s.buckets += 1
                receive(s, body)
                if body.get("weight_version"):
                    s.version = str(body["weight_version"])
                if s.args.no_sessions:
                    s.write_digests()
            if s.args.fault_bucket == k and s.args.fault == "never_answer":
                time.sleep(3600)
            if s.args.fault_bucket == k and s.args.fault == "fail_400":
                return self.reply(
                    400,
                    {
                        "success": False,
                        "message": "Failed to update weights: " "simulated load_weights error",
                    },
                )
            message = "Succeeded to update parameter online."
            if body.get("weight_version"):
                message += f" Weight version updated to {body['weight_version']}."
            return self.reply(200, {"success": True, "message": message})
        if path == "/update_weight_version":
            s.version = str(body["new_version"])
            return self.reply(
                200,
                {
                    "success": True,
                    "message": "Weight version updated to " + s.version,
                    "new_version": s.version,
                },
            )
        if path == "/end_weight_update":
            s.write_digests()
            return self.reply(200, {"success": True, "message": "end"})
        return self.reply(404, {"detail": "Not Found"})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--digests", required=True)
    p.add_argument("--fault", default="none", choices=["none", "fail_400", "never_answer"])
    p.add_argument("--no-sessions", action="store_true")
    p.add_argument("--fault-bucket", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.state = State(args)
    print(f"sglang-style engine listening on http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
