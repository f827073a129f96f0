"""Stand-in of the vLLM server front (`vllm serve`), as weightcast-train meets it:
  - EngineArgs loads the general plugins, THEN validates the config (--weight-transfer-config
    into WeightTransferConfig): a backend this version refuses stops the start, with the
    plug-in's own warning printed before vLLM's refusal.
  - TP workers are real processes (WorkerWrapperBase.init_worker in each); collective_rpc runs a
    method on every worker at once and fails if any worker raises.
  - Dev-mode routes (VLLM_SERVER_DEV_MODE=1, else 404), after dev/rlhf/api_router.py @0100a212
    and dev/rpc/api_router.py: /init_weight_transfer_engine {init_info} (400 without it),
    /start_weight_update (main ignores the body; older versions read is_checkpoint_format),
    /start_draft_weight_update (main), /update_weights {update_info} (400 without it),
    /finish_weight_update {weight_version} (main records any string, "" included),
    /update_weight_version, /weight_info (main), /pause, /resume, /reset_prefix_cache,
    /get_world_size, /server_info (vllm_config), /collective_rpc {method, args, kwargs, timeout}
    -> {"results": [...]} (dicts and lists as they are, anything else as str).
  - An engine call that raises answers 500 with {"detail": message} (the exact error body of
    upstream's exception handlers is not reproduced: the trainer reads only the status and text).
  - Run-time LoRA (lora_routes): --enable-lora / --max-lora-rank, lora_config in /server_info's
    vllm_config, the model's HF config from its directory's config.json.
  - Test hooks (no upstream counterpart): POST /standin/call {method, args, ranks} runs a
    function of the harness module on the listed workers.
"""

import argparse
import json
import multiprocessing
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from .._matrix import VERSION
from ..config.weight_transfer import WeightTransferConfig
from ..plugins import load_general_plugins


@dataclass
class VllmConfig:
    model_config: object
    parallel_config: object
    weight_transfer_config: object = None
    speculative_config: object = None
    lora_config: object = None

    def as_json(self):
        spec = self.speculative_config
        return {
            "model_config": {"model": self.model_config.model},
            "parallel_config": {
                "tensor_parallel_size": self.parallel_config.tensor_parallel_size,
                "pipeline_parallel_size": 1,
                "worker_extension_cls": self.parallel_config.worker_extension_cls,
            },
            "speculative_config": None if spec is None else {"method": spec.method},
            "lora_config": None if self.lora_config is None else vars(self.lora_config),
            "weight_transfer_config": None
            if self.weight_transfer_config is None
            else {"backend": self.weight_transfer_config.backend},
        }


def engine_config(args):
    """EngineArgs.create_engine_config: plugins first (EngineArgs.__post_init__), then validation."""
    load_general_plugins()
    wt = (
        None
        if args.weight_transfer_config is None
        else WeightTransferConfig(**json.loads(args.weight_transfer_config))
    )
    spec = None
    if args.speculative_config:
        s = json.loads(args.speculative_config)
        spec = SimpleNamespace(
            method=s["method"], draft_model_config=SimpleNamespace(model=s.get("model", "draft"))
        )
    parallel = SimpleNamespace(
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=1,
        world_size=args.tensor_parallel_size,
        worker_extension_cls=args.worker_extension_cls or "",
    )
    lora = SimpleNamespace(max_lora_rank=args.max_lora_rank, max_loras=1) if args.enable_lora else None
    model = SimpleNamespace(model=args.model, hf_config=_hf_config(args.model))
    return VllmConfig(model, parallel, wt, spec, lora)


def _hf_config(model):
    """The model's HF config, as vLLM reads it from the model directory's config.json (None for a
    model name without one)."""
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return SimpleNamespace(**json.load(f))


def worker_main(config, rank, conn):
    """One worker process: build the worker (plugins, extension, model), then serve calls. It
    dies with the front (PR_SET_PDEATHSIG), as vLLM's workers do when their engine goes."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    try:
        from ..v1.worker.worker_base import WorkerWrapperBase, resolve

        runner = resolve(os.environ["WEIGHTCAST_STANDIN_MODEL"])(config, rank)
        worker = WorkerWrapperBase(config, rank).init_worker(runner)
        conn.send(("ok", None))
    except BaseException as e:
        conn.send(("err", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    while True:
        try:
            method, args, kwargs = conn.recv()
        except EOFError:
            return
        try:
            if method.startswith("standin:"):
                fn = resolve(os.environ["WEIGHTCAST_STANDIN_HOOKS"] + "." + method[len("standin:") :])
                result = fn(worker, *args, **kwargs)
            else:
                result = getattr(worker, method)(*args, **kwargs)
            conn.send(("ok", result))
        except BaseException as e:
            conn.send(("err", f"{type(e).__name__}: {e}"))


class Engine:
    def __init__(self, config, timeout):
        self.config, self.timeout = config, timeout
        self.lock = threading.Lock()  # the engine core runs one utility call at a time
        self.weight_version = "default"
        self.paused = False
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(config.parallel_config.tensor_parallel_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(config, rank, child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for rank, conn in enumerate(self.conns):
            self._answer(conn, rank, timeout)

    def _answer(self, conn, rank, timeout):
        if not conn.poll(timeout):
            raise TimeoutError(f"worker {rank} did not answer within {timeout} s")
        status, value = conn.recv()
        if status != "ok":
            raise RuntimeError(f"worker {rank}: {value}")
        return value

    def collective_rpc(self, method, args=(), kwargs=None, ranks=None, timeout=None):
        ranks = range(len(self.conns)) if ranks is None else ranks
        with self.lock:
            for r in ranks:
                self.conns[r].send((method, list(args), kwargs or {}))
            results, errors = [], []
            for r in ranks:
                try:
                    results.append(self._answer(self.conns[r], r, timeout or self.timeout))
                except Exception as e:
                    errors.append(str(e))
        if errors:
            raise RuntimeError("; ".join(errors))
        return results

    def stop(self):
        for p in self.procs:
            p.kill()
            p.join(5)


class Failure(Exception):
    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status


def routes(engine):
    dev = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"

    def need(body, key):
        if not isinstance(body, dict) or body.get(key) is None:
            raise Failure(400, f"Missing '{key}' in request body")
        return body[key]

    def finish(body):
        engine.collective_rpc("finish_weight_update")
        if VERSION.weight_info and isinstance(body, dict) and body.get("weight_version") is not None:
            engine.weight_version = body["weight_version"]
        return {"message": "Weight update finished"}

    def start(body):
        kwargs = {}
        if not VERSION.draft_target and isinstance(body, dict) and "is_checkpoint_format" in body:
            kwargs["is_checkpoint_format"] = bool(body["is_checkpoint_format"])
        engine.collective_rpc("start_weight_update", kwargs=kwargs)
        return {"message": "Weight update started"}

    def rpc(body):
        method = need(body, "method")
        results = engine.collective_rpc(
            method, body.get("args", []), body.get("kwargs", {}), timeout=body.get("timeout")
        )
        return {"results": [r if r is None or isinstance(r, (dict, list)) else str(r) for r in results]}

    def update_version(body):
        engine.weight_version = need(body, "new_version")
        return {"success": True, "new_version": engine.weight_version}

    def hook(body):
        return {
            "results": engine.collective_rpc(
                "standin:" + body["method"], body.get("args", []), ranks=body.get("ranks")
            )
        }

    post = {
        "/init_weight_transfer_engine": lambda b: (
            engine.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": need(b, "init_info")}),
            {"message": "Weight transfer initialized"},
        )[1],
        "/start_weight_update": start,
        "/update_weights": lambda b: (
            engine.collective_rpc("update_weights", kwargs={"update_info": need(b, "update_info")}),
            {"message": "Weights updated"},
        )[1],
        "/finish_weight_update": finish,
        "/pause": lambda b: (setattr(engine, "paused", True), {"status": "paused"})[1],
        "/resume": lambda b: (setattr(engine, "paused", False), {"status": "resumed"})[1],
        "/reset_prefix_cache": lambda b: {"status": "ok"},
        "/collective_rpc": rpc,
        "/standin/call": hook,
    }
    get = {
        "/health": lambda: {},
        "/server_info": lambda: {"vllm_config": engine.config.as_json()},
        "/get_world_size": lambda: {"world_size": engine.config.parallel_config.tensor_parallel_size},
    }
    if VERSION.draft_target:
        post["/start_draft_weight_update"] = lambda b: (
            engine.collective_rpc("start_draft_weight_update"),
            {"message": "Draft weight update started"},
        )[1]
    if VERSION.weight_info:
        post["/update_weight_version"] = update_version
        get["/weight_info"] = lambda: {"weight_version": engine.weight_version}
    if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"):
        post.update(lora_routes(engine))
    if not dev:
        for table in (post, get):
            for route in [r for r in table if r != "/health"]:
                del table[route]
    return post, get


class Answer:
    """A route's answer other than a JSON 200: `status` and a body (JSON, or text)."""

    def __init__(self, status, body):
        self.status, self.body = status, body


def lora_routes(engine):
    """/v1/load_lora_adapter and /v1/unload_lora_adapter (vllm/entrypoints/serve/lora/api_router.py
    @27873cab97e41ef32a6a8bcf83fa475a23e6e921, OpenAIServingModels in
    vllm/entrypoints/openai/models/serving.py @4fe4500477d5bbf2c2a467adacc60f7d215cd655): served
    only with VLLM_ALLOW_RUNTIME_LORA_UPDATING; a name already loaded is a 400 unless
    load_inplace, which reloads it under its id; the engine's add_lora failing is a 400 with its
    text; an unknown name on unload a 404; success a plain-text 200. Errors are
    {"error": {"message", "type", "code"}}."""
    registry, counter = {}, [0]

    def error(status, kind, message):
        return Answer(status, {"error": {"message": message, "type": kind, "code": status}})

    def load(body):
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error(400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
        inplace = bool(body.get("load_inplace", False))
        if name in registry and not inplace:
            return error(
                400,
                "InvalidUserInput",
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True.",
            )
        if name in registry:
            lora_id = registry[name]["lora_int_id"]
        else:
            counter[0] += 1
            lora_id = counter[0]
        request = {"lora_name": name, "lora_int_id": lora_id, "lora_path": path, "load_inplace": inplace}
        try:
            engine.collective_rpc("add_lora", [request])
        except Exception as e:
            status = 404 if "No adapter found" in str(e) else 400
            return error(status, "NotFoundError" if status == 404 else "BadRequestError", str(e))
        registry[name] = request
        return Answer(200, f"Success: LoRA adapter '{name}' added successfully.")

    def unload(body):
        name = body.get("lora_name")
        if name not in registry:
            return error(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        del registry[name]
        return Answer(200, f"Success: LoRA adapter '{name}' removed successfully.")

    return {"/v1/load_lora_adapter": load, "/v1/unload_lora_adapter": unload}


def serve(engine, port_file):
    post, get = routes(engine)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status, body):
            """JSON, or plain text for a str (vLLM's LoRA routes answer text on success)."""
            if isinstance(body, str):
                data, kind = body.encode(), "text/plain"
            else:
                data, kind = json.dumps(body).encode(), "application/json"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _run(self, fn, *args):
            try:
                out = fn(*args)
                if isinstance(out, Answer):
                    return self._send(out.status, out.body)
                self._send(200, out)
            except Failure as e:
                self._send(e.status, {"detail": str(e)})
            except Exception as e:
                self._send(500, {"detail": f"{type(e).__name__}: {e}"})

        def do_GET(self):
            fn = get.get(self.path.split("?")[0])
            if fn is None:
                return self._send(404, {"detail": "Not Found"})
            self._run(fn)

        def do_POST(self):
            fn = post.get(self.path.split("?")[0])
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if fn is None:
                return self._send(404, {"detail": "Not Found"})
            try:
                body = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                return self._send(400, {"detail": "Invalid JSON format"})
            self._run(fn, body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


def main(argv=None):
    p = argparse.ArgumentParser(prog="vllm serve (stand-in)")
    p.add_argument("--model", default="weightcast-tiny")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--weight-transfer-config")
    p.add_argument("--worker-extension-cls")
    p.add_argument("--speculative-config")
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int, default=16)
    p.add_argument("--port-file", required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    try:
        config = engine_config(args)
        engine = Engine(config, args.timeout)
    except Exception as e:
        print(f"vllm serve: start failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    try:
        serve(engine, args.port_file)
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
