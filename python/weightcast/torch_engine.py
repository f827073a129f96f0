"""The torch reference engine: a tensor-parallel torch LM served over HTTP, updated through
weightcast.Receiver in every worker.

    python3 -m weightcast.torch_engine --tp 2 --model tiny --port 0 --port-file /tmp/port

It is the working example of embedding weightcast in an engine: N worker processes (one per TP
rank, weightcast/torch_worker.py) each hold only their shard in fused qkv_proj / gate_up_proj
parameters, load HF-named full tensors through ``load_weights`` (narrowed in place), and receive
updates with their own Receiver. This front process serves the control plane with weightcast's
routes and field names (docs/protocol.md), relaying each call to every worker, plus:

    POST /generate {"input_ids": [...], "sampling_params": {"max_new_tokens": n}}
        greedy decoding; answers {"output_ids", "meta_info": {"weight_version"}}
    GET  /spec_accept_length   the draft's speculative accept length (sync/model/spec_probe.h)

--api vllm serves vLLM's dev-mode weight-transfer routes instead of weightcast's (the ones a
vLLM server with the ``weightcast`` backend serves, answered in vLLM's shapes; weightcast-train
detects them from /server_info): /init_weight_transfer_engine {init_info},
/start_weight_update, /start_draft_weight_update, /update_weights {update_info},
/finish_weight_update {weight_version}, /pause?mode=, /resume, /reset_prefix_cache,
/get_world_size, /weight_info, /server_info (vllm_config). The bodies are read with the vLLM
plug-in's own parsers (weightcast.engine_rank.parse_init_info / parse_update_info).
--api sglang keeps the routes and answers /server_info in SGLang's shape (no "success"), with
the plug-in's announce in ``internal_states``. Every API adds a ``weightcast`` key to
/server_info (version, receiver, runners, whether our native routes are served), as the SGLang
plug-in adds it to SGLang's; under --api sglang and vllm sessions have no owners.

--debug-routes adds test hooks (/debug/save_params, /debug/fail_load, /debug/fail_bucket,
/debug/info).
Sessions are owned as in weightcast-engine: a begin that names a holder gets a session_id every
later call must carry. A bucket that fails on any worker aborts the session on all of them.
"""

import argparse
import datetime
import itertools
import json
import multiprocessing
import os
import secrets
import sys
import threading
import time
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from . import __version__, torch_worker
from .engine_rank import parse_init_info, parse_update_info


class WorkerError(Exception):
    def __init__(self, info):
        super().__init__(info.get("message", "worker failed"))
        self.info = info
        self.status = info.get("status", 500)


def most_telling(errors):
    """One error for the client from the workers' [(rank, WorkerError)]: the most telling first.
    A worker whose peer left ("[peer: ...]") reports a consequence of that peer's own failure (its
    timeout, its refusal); a timeout may be the consequence of a refusal, a 409 of an abort. The
    others follow in the message, each naming its worker."""
    ordered = sorted(errors, key=lambda re: ("[peer: " in str(re[1]), re[1].status == 504,
                                             re[1].status == 409))
    first = ordered[0][1]
    if len(ordered) == 1:
        return first
    others = "; ".join(f"worker {rank}: {e}" for rank, e in ordered[1:])
    return WorkerError(dict(first.info, message=f"{first} (also {others})"))


class Workers:
    """The worker processes and the pipes to them; call_all() runs one operation on each."""

    def __init__(self, cfg):
        import torch.distributed as dist

        self.cfg = cfg
        ctx = multiprocessing.get_context("spawn")
        # The TP group's store: bound to an ephemeral port and kept by this process.
        self.store = dist.TCPStore(cfg["tp_host"], 0, None, True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=cfg["init_timeout"]))
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.pending = {}
        self.procs, self.conns, self.send_locks = [], [], []
        for rank in range(cfg["tp"]):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=torch_worker.main, args=(rank, cfg, child, self.store.port), daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
            self.send_locks.append(threading.Lock())
        deadline = time.monotonic() + cfg["init_timeout"] + 60
        for rank, conn in enumerate(self.conns):
            if not conn.poll(max(0.1, deadline - time.monotonic())):
                raise RuntimeError(f"worker {rank} did not start in time")
            _, ok, payload = conn.recv()
            if not ok:
                raise RuntimeError(f"worker {rank} failed to start: {payload}")
        for rank, conn in enumerate(self.conns):
            threading.Thread(target=self._read, args=(rank, conn), daemon=True).start()

    def _read(self, rank, conn):
        while True:
            try:
                rid, ok, payload = conn.recv()
            except (EOFError, OSError):
                with self.lock:
                    futures = [f for (r, _), f in self.pending.items() if r == rank]
                for f in futures:
                    if not f.done():
                        f.set_exception(WorkerError({"status": 500, "message": f"worker {rank} exited"}))
                return
            with self.lock:
                future = self.pending.pop((rank, rid), None)
            if future is None:
                continue
            if ok:
                future.set_result(payload)
            else:
                future.set_exception(WorkerError(payload))

    def call_all(self, op, *args, timeout=None):
        """Runs `op` on every worker; the answers in rank order, or the first failure."""
        rid = next(self.ids)
        futures = []
        for rank, conn in enumerate(self.conns):
            f = Future()
            with self.lock:
                self.pending[(rank, rid)] = f
            with self.send_locks[rank]:
                conn.send((rid, op, args))
            futures.append(f)
        limit = timeout if timeout is not None else self.cfg["comm_timeout"] * 10 + 60
        results, errors = [], []
        for rank, f in enumerate(futures):
            try:
                results.append(f.result(timeout=limit))
            except WorkerError as e:
                errors.append((rank, e))
            except Exception as e:  # a timeout: the worker is stuck
                errors.append((rank, WorkerError({"status": 504, "message": f"{op}: no answer in {limit} s ({e!r})"})))
        if errors:
            raise most_telling(errors)
        return results

    def close(self):
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


class Engine:
    """The control plane's state: session ownership, pause, and the relays."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.workers = Workers(cfg)
        self.mu = threading.Lock()
        self.model_lock = threading.Lock()  # collectives across workers: one at a time
        self.session = None  # {"selector", "token", "holder"}
        self.paused = threading.Event()
        self.weight_version = "default"
        self.last_activity = time.monotonic()
        self.busy = 0  # bucket requests in flight (bounded by the workers' comm timeout)
        self.fail_bucket = None  # test hook: the bucket (sequence) refused once received
        threading.Thread(target=self._watchdog, daemon=True).start()

    def touch(self):
        self.last_activity = time.monotonic()

    def _watchdog(self):
        """As weightcast-engine: a session that sees no request for session_timeout is aborted,
        and a pause left with no session and no request for as long is lifted (its trainer is
        gone; the engine must keep generating)."""
        limit = self.cfg["session_timeout"]
        while True:
            time.sleep(min(0.2, limit / 4))
            # Decided and done under mu, as update() counts its buckets and begin() opens a session:
            # no bucket is cut mid-way, and no session opened meanwhile is aborted.
            with self.mu:
                idle = time.monotonic() - self.last_activity
                if self.busy or idle < limit:
                    continue
                if self.session is not None:
                    self.session = None
                    try:
                        self.workers.call_all("abort", f"session timed out: no request for {limit} s")
                    except WorkerError:
                        pass
                    self.touch()
                elif self.paused.is_set():
                    self.paused.clear()

    def runners(self):
        runners = [{"name": "target", "filters": torch_worker.TARGET_FILTER.split(","), "layout": "none",
                    "tensor_count": self.tensor_count("target"), "seed": self.cfg["seed"]}]
        if self.cfg["draft"]:
            runners.append({"name": "draft", "filters": torch_worker.DRAFT_FILTER.split(","), "layout": "none",
                            "tensor_count": self.tensor_count("draft"), "seed": self.cfg["seed"]})
        return runners

    def announce(self):
        """The `weightcast` key of /server_info: what the trainer reads to know a weightcast
        receiver runs inside (the SGLang plug-in adds the same key to SGLang's answer)."""
        return {"version": __version__, "receiver": "weightcast.Receiver", "runners": self.runners(),
                "native_routes": self.cfg["api"] == "weightcast", "routes": ["/weights_checksum"]}

    def info(self):
        runners = self.runners()
        return {"success": True, "message": "ok", "version": __version__, "runners": runners,
                "selectors": ["all", "target", "draft"], "backends": ["gloo"],
                "rank_count": self.cfg["tp"], "tp_size": self.cfg["tp"], "dp_size": 1, "pp_size": 1,
                "weight_version": self.weight_version, "engine": "weightcast.torch_engine",
                "weight_receiver": "weightcast.Receiver",
                "speculative_algorithm": "EAGLE" if self.cfg["draft"] else None,
                "session_selector": self.session["selector"] if self.session else None,
                "weightcast": self.announce(), "internal_states": [{"weightcast": self.announce()}]}

    def sglang_info(self):
        """SGLang's /server_info shape (--api sglang): its ServerArgs fields the trainer reads,
        and the plug-in's announce in internal_states, as a real SGLang with weightcast.sglang
        answers."""
        return {"tp_size": self.cfg["tp"], "dp_size": 1, "pp_size": 1, "weight_version": self.weight_version,
                "speculative_algorithm": "EAGLE" if self.cfg["draft"] else None, "model_path": self.cfg["model"],
                "version": "torch-engine", "internal_states": [{"weightcast": self.announce()}]}

    def vllm_info(self):
        """vLLM's /server_info (dev mode, config_format=json) for this engine, plus the announce."""
        spec = {"method": "eagle", "num_speculative_tokens": 4} if self.cfg["draft"] else None
        config = {"model_config": {"model": self.cfg["model"]},
                  "parallel_config": {"tensor_parallel_size": self.cfg["tp"], "pipeline_parallel_size": 1,
                                      "data_parallel_size": 1},
                  "speculative_config": spec, "weight_transfer_config": {"backend": "weightcast"}}
        return {"vllm_config": config, "vllm_env": {}, "system_env": {}, "weightcast": self.announce()}

    def tensor_count(self, runner):
        if not hasattr(self, "_counts"):
            self._counts = self.workers.call_all("info")[0]["tensor_count"]
        return self._counts.get(runner, 0)

    def check_owner(self, token):
        s = self.session
        if s is None:
            raise WorkerError({"status": 409, "message": "no update session is open"})
        if token is not None and token != s["token"]:
            raise WorkerError({"status": 409, "message": "session_id does not name the open session"})
        if token is None and s["holder"] is not None:
            raise WorkerError({"status": 409, "message": f"the session belongs to {s['holder']}; send its session_id"})

    # --- routes --------------------------------------------------------------------------------
    def init_group(self, body):
        self.workers.call_all("join", json.dumps(body), timeout=self.cfg["init_timeout"] + 30)
        return {"message": f"joined group '{body.get('group_name', 'weight_update_group')}'"}

    def destroy_group(self, body):
        self.workers.call_all("leave", body.get("group_name", "weight_update_group"))
        return {"message": "left group"}

    def begin(self, body):
        selector = body.get("selector", "all")
        if self.cfg["api"] != "weightcast":
            body = {k: v for k, v in body.items() if k != "holder"}  # SGLang and vLLM own no sessions
        with self.mu:
            if self.session is not None:
                raise WorkerError({"status": 409, "message": "begin_weight_update: a session is already open"})
            answers = self.workers.call_all("begin", selector)
            token = secrets.token_hex(16)
            self.session = {"selector": selector, "token": token, "holder": body.get("holder")}
        out = {"message": "session opened", "selector": selector, "session_id": token,
               "weight_version": answers[0]["weight_version"]}
        if body.get("holder"):
            out["holder"] = body["holder"]
        if answers[0]["runner_digest"]:
            out["runner_digest"] = answers[0]["runner_digest"]
        return out

    def update(self, body, implicit_ok=True):
        # Clients that open no session (SGLang's own, slime) get one per bucket: staged, verified
        # and committed by the workers before the answer (the plug-ins' rule, engine_rank.py).
        # vLLM's routes never do: a bucket outside start/finish (after an abort) is refused.
        implicit = implicit_ok and self.session is None and body.get("session_id") is None
        with self.mu:  # the watchdog decides under mu
            if not implicit:
                self.check_owner(body.get("session_id"))
            self.busy += 1
        try:
            # Ownership is checked here; the workers' sessions are this front's own.
            relayed = {k: v for k, v in body.items() if k != "session_id"}
            if implicit:
                with self.model_lock:
                    answers = self.workers.call_all("receive", json.dumps(relayed))
                self.weight_version = answers[0]["weight_version"]
            else:
                answers = self.workers.call_all("receive", json.dumps(relayed))
            if self.fail_bucket is not None and body.get("sequence") == self.fail_bucket:
                # Test hook (/debug/fail_bucket): the engine fails this bucket after the broadcast,
                # as it would a bucket whose bytes do not match their digests.
                self.fail_bucket = None
                raise WorkerError({"status": 500, "message": f"injected failure of bucket {body['sequence']} "
                                                            "after it was received"})
        except WorkerError:
            self.abort_all("a bucket failed on a worker")
            raise
        finally:
            with self.mu:
                self.busy -= 1
            self.touch()
        message = f"bucket received: {len(body.get('names', []))} tensors ({answers[0]['message']})"
        if body.get("weight_version") is not None:
            message += f". Weight version updated to {body['weight_version']}."
        return {"message": message}

    # --- vLLM's routes (--api vllm) ------------------------------------------------------------
    def vllm_init(self, body):
        group, _ = parse_init_info(body.get("init_info"))  # keep_delta_base: this engine's --delta
        self.init_group(group)
        return {"message": "Weight transfer initialized"}

    def vllm_start(self, selector):
        if self.session is not None:  # as the plug-in's backend: a new start drops a stale round
            self.abort_all("a new update started before the previous one finished")
        self.begin({"selector": selector})
        return {"message": "Weight update started"}

    def vllm_update(self, body):
        if "update_info" not in body:
            raise WorkerError({"status": 400, "message": "Missing 'update_info' in request body"})
        kind, payload = parse_update_info(body["update_info"])
        if kind == "abort":
            if self.session is not None:
                self.abort_all(payload)
            return {"message": f"Weight update aborted: {payload}"}
        if self.session is None:
            raise WorkerError({"status": 409, "message": "update_weights without start_weight_update"})
        self.update(payload, implicit_ok=False)
        return {"message": "Weights updated"}

    def vllm_finish(self, body):
        version = body.get("weight_version")
        if self.session is None:
            raise WorkerError({"status": 409, "message": "finish_weight_update without start_weight_update"})
        if version is not None:
            self.set_version({"new_version": str(version)})
        self.end({})
        return {"message": "Weight update finished"}

    def abort_all(self, reason):
        with self.mu:
            self.session = None
        self.workers.call_all("abort", reason)

    def set_version(self, body):
        if self.session is not None:
            self.check_owner(body.get("session_id"))
        self.workers.call_all("set_version", body["new_version"])
        if self.session is None:
            self.weight_version = body["new_version"]
        return {"message": f"weight_version '{body['new_version']}'"}

    def end(self, body):
        with self.mu:  # as update(): the watchdog decides under mu
            self.check_owner(body.get("session_id"))
            selector = self.session["selector"]
            self.session = None
        with self.model_lock:
            answers = self.workers.call_all("commit", None, selector)
        versions = {a["weight_version"] for a in answers}
        if len(versions) != 1:
            raise WorkerError({"status": 500, "message": f"workers committed different versions: {versions}"})
        self.weight_version = answers[0]["weight_version"]
        slowest = max(a.get("seconds", 0) for a in answers)
        print(f"weightcast.torch_engine: committed version {answers[0]['weight_version']} "
              f"(load and finish: {slowest:.3f} s on the slowest worker)", flush=True)
        out = {"message": f"committed (slowest worker {slowest:.3f} s)", "weight_version": self.weight_version, "runners": answers[0]["runners"]}
        if answers[0]["runner_digest"]:
            out["runner_digest"] = answers[0]["runner_digest"]
        return out

    def abort(self, body):
        if self.session is None:
            return {"message": "no session was open"}
        if not body.get("force"):
            self.check_owner(body.get("session_id"))
        self.abort_all("aborted by abort_weight_update")
        return {"message": "session aborted; staged tensors discarded, previous weights kept"}

    def generate(self, body):
        deadline = time.monotonic() + self.cfg["comm_timeout"]
        while self.paused.is_set():
            if time.monotonic() > deadline:
                raise WorkerError({"status": 503, "message": "generation is paused"})
            time.sleep(0.01)
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            raise WorkerError({"status": 400, "message": "input_ids: a non-empty list of token ids"})
        n = int(body.get("sampling_params", {}).get("max_new_tokens", 8))
        with self.model_lock:
            version = self.weight_version
            out = self.workers.call_all("generate", ids, n)[0]
        return {"output_ids": out[len(ids):], "meta_info": {"weight_version": version,
                                                             "prompt_tokens": len(ids),
                                                             "completion_tokens": n}}

    def accept_length(self):
        if not self.cfg["draft"]:
            raise WorkerError({"status": 409, "message": "this engine holds no draft"})
        with self.model_lock:
            value = self.workers.call_all("accept_length")[0]
        return {"accept_length": value, "draft_tokens": 4, "weight_version": self.weight_version}

    def checksum(self, runner, recompute):
        if runner not in ("target", "draft") or (runner == "draft" and not self.cfg["draft"]):
            raise WorkerError({"status": 400, "message": f"runner: no runner '{runner}'"})
        with self.model_lock:
            answer = self.workers.call_all("checksum", runner, recompute)[0]
        return {"runner": runner, "weight_version": self.weight_version, "recomputed": recompute, **answer}


def weightcast_routes(engine):
    posts = {
        "/init_weights_update_group": engine.init_group,
        "/destroy_weights_update_group": engine.destroy_group,
        "/begin_weight_update": engine.begin,
        "/update_weights_from_distributed": engine.update,
        "/update_weight_version": engine.set_version,
        "/end_weight_update": engine.end,
        "/abort_weight_update": engine.abort,
        "/pause_generation": lambda b: (engine.paused.set(), {"message": "generation paused"})[1],
        "/continue_generation": lambda b: (engine.paused.clear(), {"message": "generation resumed"})[1],
        "/flush_cache": lambda b: {"message": "cache flushed"},
    }
    gets = {
        "/health": lambda q: {"message": "ok"},
        "/server_info": lambda q: engine.info(),
        "/get_server_info": lambda q: engine.info(),
        "/flush_cache": lambda q: {"message": "cache flushed"},
        "/get_weight_version": lambda q: {"weight_version": engine.weight_version},
        "/model_info": lambda q: {"weight_version": engine.weight_version, "model_path": engine.cfg["model"]},
    }
    return posts, gets


def vllm_routes(engine):
    """vLLM's dev-mode routes, answered in vLLM's shapes ({"message"}, {"status"})."""
    def pause(mode):
        if mode not in ("abort", "wait", "keep"):
            raise WorkerError({"status": 400, "message": f"mode: 'abort', 'wait' or 'keep' (got '{mode}')"})
        engine.paused.set()
        return {"status": "paused"}

    posts = {
        "/init_weight_transfer_engine": engine.vllm_init,
        "/start_weight_update": lambda b: engine.vllm_start(b.get("selector") or "target"),
        "/start_draft_weight_update": lambda b: engine.vllm_start("draft"),
        "/update_weights": engine.vllm_update,
        "/finish_weight_update": engine.vllm_finish,
        "/pause": lambda b: pause(b.get("mode", "abort")),
        "/resume": lambda b: (engine.paused.clear(), {"status": "resumed"})[1],
        "/reset_prefix_cache": lambda b: {},
    }
    gets = {
        "/health": lambda q: {},
        "/server_info": lambda q: engine.vllm_info(),
        "/get_world_size": lambda q: {"world_size": engine.cfg["tp"]},
        "/weight_info": lambda q: {"weight_version": engine.weight_version},
        "/is_paused": lambda q: {"is_paused": engine.paused.is_set()},
    }
    return posts, gets


def make_handler(engine):
    vllm = engine.cfg["api"] == "vllm"
    posts, gets = vllm_routes(engine) if vllm else weightcast_routes(engine)
    if engine.cfg["api"] == "sglang":  # SGLang's server info; its routes are the ones above
        gets["/server_info"] = gets["/get_server_info"] = lambda q: engine.sglang_info()
    posts["/generate"] = engine.generate
    gets["/spec_accept_length"] = lambda q: engine.accept_length()
    gets["/weights_checksum"] = lambda q: engine.checksum(q.get("runner", ["target"])[0],
                                                          q.get("recompute", ["0"])[0] in ("1", "true"))
    if engine.cfg["debug_routes"]:
        posts["/debug/save_params"] = lambda b: (engine.workers.call_all("save", b["path"]), {"message": "saved"})[1]
        posts["/debug/reset_peak"] = lambda b: (engine.workers.call_all("reset_peak"), {"message": "reset"})[1]
        posts["/debug/fail_load"] = lambda b: (engine.workers.call_all("fail_load", b.get("tensor")), {"message": "set"})[1]
        posts["/debug/fail_bucket"] = lambda b: (setattr(engine, "fail_bucket", b.get("sequence")),
                                                 {"message": "set"})[1]
        gets["/debug/info"] = lambda q: {"workers": engine.workers.call_all("info")}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _answer(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, table, arg):
            path = urlparse(self.path).path
            fn = table.get(path)
            if self.command == "POST":
                engine.touch()
            if fn is None:
                return self._fail(404, f"no route {self.path}")
            # vLLM's answers, and SGLang's server info, come as they are; our own routes keep our
            # shape whatever the API (the trainer reads them strictly).
            plain = vllm or (engine.cfg["api"] == "sglang" and path in ("/server_info", "/get_server_info"))
            ours = not plain or path in ("/weights_checksum", "/spec_accept_length") or path.startswith("/debug/")
            try:
                out = fn(arg)
                self._answer(200, {"success": True, "message": "", **out} if ours else out)
            except WorkerError as e:
                self._fail(e.status, str(e))
            except (KeyError, ValueError, TypeError) as e:
                self._fail(400, f"bad request: {e!r}")

        def _fail(self, status, message):
            # vLLM's failures are FastAPI's {"detail": ...}; ours {"success": false, "message"}.
            self._answer(status, {"detail": message} if vllm else {"success": False, "message": message})

        def do_GET(self):
            self._serve(gets, parse_qs(urlparse(self.path).query))

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw.strip() else {}
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as e:
                return self._fail(400, f"body: {e}")
            for key, values in parse_qs(urlparse(self.path).query).items():
                body.setdefault(key, values[0])  # vLLM's query parameters (/pause?mode=...)
            self._serve(posts, body)

    return Handler


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m weightcast.torch_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel worker processes")
    p.add_argument("--model", default="tiny", help="weightcast model preset (sync/model/model.h)")
    p.add_argument("--num-layers", type=int, help="override the preset's num_hidden_layers (as weightcast-train's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights (the trainer's --seed)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: an ephemeral port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--no-draft", action="store_true", help="serve no EAGLE-style draft")
    p.add_argument("--delta", action="store_true",
                   help="keep the last committed tensors on the host so delta buckets apply")
    p.add_argument("--legacy-finalize", action="store_true",
                   help="the old behaviour: post-process every covered runner at the end of a session")
    p.add_argument("--bind-address", default="127.0.0.1", help="data-plane address of the workers")
    p.add_argument("--store-token", default=None)
    p.add_argument("--init-timeout", type=float, default=60.0)
    p.add_argument("--comm-timeout", type=float, default=60.0)
    p.add_argument("--session-timeout", type=float, default=60.0,
                   help="abort a session (and lift a pause) idle this many seconds")
    p.add_argument("--api", choices=("weightcast", "sglang", "vllm"), default="weightcast",
                   help="control-plane routes: weightcast's (with SGLang's names); sglang: the same "
                        "routes, /server_info in SGLang's shape with the plug-in's announce; vllm: "
                        "vLLM's dev-mode weight-transfer routes")
    p.add_argument("--debug-routes", action="store_true", help="test hooks under /debug/")
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    model = a.model
    if a.num_layers:
        from .torch_model import model_spec
        spec = model_spec(a.model)
        spec["num_hidden_layers"] = a.num_layers
        model = json.dumps(spec)
    cfg = {"tp": a.tp, "model": model, "seed": a.seed, "draft": not a.no_draft, "delta": a.delta,
           "legacy_finalize": a.legacy_finalize, "bind_address": a.bind_address, "tp_host": "127.0.0.1",
           "store_token": a.store_token, "init_timeout": a.init_timeout, "comm_timeout": a.comm_timeout,
           "session_timeout": a.session_timeout, "debug_routes": a.debug_routes, "api": a.api}
    engine = Engine(cfg)
    server = ThreadingHTTPServer((a.host, a.port), make_handler(engine))
    server.daemon_threads = True
    port = server.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, a.port_file)
    print(f"weightcast.torch_engine: serving on http://{a.host}:{port} (tp {a.tp}, model {a.model}, "
          f"api {a.api})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        engine.workers.close()


if __name__ == "__main__":
    sys.exit(main())
