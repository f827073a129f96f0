"""A 2-rank TP "SGLang" made of the stand-in pieces (tests/upstream/sglang/standin): an HTTP front
with SGLang's weight-update routes and answer shapes, and one process per TP rank running the
stand-in Scheduler over a TpModelWorker (the target: weightcast's small torch model, fused
qkv/gate_up, sharded by TP) and a draft worker (the replicated EAGLE-style draft, whose post-load
processing is a non-idempotent shuffle). Every process calls ``load_plugins()`` first, as SGLang's
do, so whatever ``sglang.srt.plugins`` entry points are installed run there.

Usage: engine.py [--tp 2] [--seed 1] [--timeout 60]
Prints "sglang stand-in listening on http://127.0.0.1:PORT" once it serves (an ephemeral port it
keeps). SGLANG_STANDIN_CELL picks the upstream version (sglang/cells.py).

Routes (SGLang's http_server.py, INTEROP.md §6): POST /init_weights_update_group,
/destroy_weights_update_group, /update_weights_from_distributed ({"success", "message"}, 200 or
400), /begin_weight_update, /end_weight_update and /update_weights_from_tensor (only where the
version has sessions; 404 elsewhere), /update_weight_version ({"success", "message", "new_version"}), /pause_generation and
/continue_generation ({"message", "status": "ok"}), GET|POST /flush_cache (plain text), GET
/health (empty body; 503 once a scheduler died), /get_server_info (and /server_info on main) with
``internal_states``, /get_weight_version; where the cell has them, SGLang's run-time LoRA routes
/load_lora_adapter_from_distributed, /load_lora_adapter_from_tensors and /unload_lora_adapter
({"success", "error_message", "loaded_adapters"}, 200 or 400; the engine runs as with
--enable-lora). GET /stand_in/state (the harness's, not SGLang's): each
rank's parameters as hex of their bytes, how often each runner began and post-processed, and the
adapters its LoRA manager holds (each tensor's bytes as hex).
"""

import argparse
import http.server
import json
import logging
import multiprocessing
import signal
import sys
import threading
import traceback
import types


# --- one TP rank -------------------------------------------------------------------------------


def _initial(model, runner, seed):
    import torch

    from weightcast import _weightcast

    pairs = []
    for name, dtype, shape, raw in _weightcast._model_tensors(model, runner, seed, 0):
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        pairs.append((name, flat.view(getattr(torch, dtype)).view(shape)))
    return pairs


def _models(rank, tp, seed):
    from weightcast.reference.model import DraftModel, Parallel, TargetModel, model_spec

    spec = model_spec("tiny")
    target, draft = TargetModel(spec, Parallel(rank, tp)), DraftModel(spec)
    target.config = types.SimpleNamespace(**spec)  # SGLang's models keep their HF config as .config
    target.load_weights(iter(_initial("tiny", "target", seed)))
    draft.load_weights(iter(_initial("tiny", "draft", seed)))
    draft.process_weights_after_loading()  # SGLang post-processes at start-up
    return target, draft


def _state(scheduler):
    from expected import hexes

    out = {"params": {}, "runners": {}}
    for role, worker in (("target", scheduler.tp_worker), ("draft", scheduler.draft_worker)):
        runner = worker.model_runner
        out["params"][role] = hexes(runner.model.named_parameters())
        out["runners"][role] = {"begun": runner.begun, "post_processed": runner.post_processed}
    manager = getattr(scheduler.tp_worker.model_runner, "lora_manager", None)
    if manager is not None:
        out["adapters"] = {name: hexes(held.items()) for name, held in manager.held().items()}
    return out


def worker_main(rank, tp, seed, conn):
    """One TP rank: SGLang's scheduler process (plug-ins loaded first)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the front
    logging.basicConfig(level=logging.INFO, format=f"[tp{rank}] %(name)s %(levelname)s: %(message)s")
    try:
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.managers.tp_worker import TpModelWorker
        from sglang.srt.model_executor.model_runner import ModelRunner

        target, draft = _models(rank, tp, seed)
        scheduler = Scheduler(
            TpModelWorker(ModelRunner(target, tp_rank=rank, tp_size=tp)),
            TpModelWorker(ModelRunner(draft, tp_rank=rank, tp_size=tp, role="draft"), role="draft"),
        )
        conn.send(("ready", None))
    except Exception:
        conn.send(("crashed", traceback.format_exc()))
        return
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req == "exit":
            return
        try:
            conn.send(("ok", _state(scheduler) if req == "state" else scheduler.handle(req)))
        except Exception:
            # As SGLang's event loop: an exception out of a handler ends the scheduler.
            conn.send(("crashed", traceback.format_exc()))
            return


# --- the HTTP front ----------------------------------------------------------------------------


class Front:
    def __init__(self, args):
        from sglang.cells import CELL
        from sglang.srt.managers import io_struct

        self.cell, self.io, self.args = CELL, io_struct, args
        self.version = "default"
        self.dead = None
        self.lock = threading.Lock()
        self.lora_lock = threading.Lock()
        if self.cell.lora:
            from sglang.srt.lora.lora_registry import LoRARegistry

            self.registry = LoRARegistry()
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(args.tp):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(rank, args.tp, args.seed, child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for reply in self._gather(self.args.timeout):
            if reply[0] != "ready":
                raise RuntimeError(f"a TP rank failed to start:\n{reply[1]}")

    def _gather(self, timeout):
        replies = []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(timeout):
                raise TimeoutError(f"TP rank {rank} did not answer within {timeout} s")
            replies.append(conn.recv())
        return replies

    def call(self, req):
        """`req` to every TP rank at once (they receive together); rank 0's answer, failed
        unless every rank succeeded."""
        with self.lock:
            if self.dead:
                raise RuntimeError(f"the scheduler died: {self.dead}")
            for conn in self.conns:
                conn.send(req)
            replies = self._gather(self.args.timeout)
        crashed = [r[1] for r in replies if r[0] != "ok"]
        if crashed:
            self.dead = crashed[0].strip().splitlines()[-1]
            raise RuntimeError(f"the scheduler died: {crashed[0]}")
        outs = [r[1] for r in replies]
        return outs

    def weight_call(self, route, body):
        cls = getattr(self.io, self.io.ROUTES[route])
        outs = self.call(self.io.from_json(cls, body))
        success = all(o.success for o in outs)
        message = next((o.message for o in outs if not o.success), outs[0].message)
        if (
            success
            and route in ("/update_weights_from_distributed", "/update_weights_from_tensor")
            and body.get("weight_version") is not None
        ):
            self.version = body["weight_version"]
            message += f" Weight version updated to {self.version}."
        return (200 if success else 400), {"success": success, "message": message}

    def lora_call(self, route, body):
        """The tokenizer side of SGLang's run-time LoRA routes (tokenizer_control_mixin.py on
        sglang-miles @a0e1292f): under one lock, the registry resolves the request's lora_id (an
        upsert of a held name reuses it; the from-tensors route refuses upsert), every TP rank
        loads, and the name is registered only when rank 0's answer (the first reply) succeeds;
        an unload unregisters first (an unknown name is a failure). 200 on success, else 400,
        the body LoRAUpdateOutput's fields."""
        from sglang.srt.lora.lora_registry import LoRARef

        cls = getattr(self.io, self.io.LORA_ROUTES[route])
        with self.lora_lock:
            try:
                req = self.io.from_json(cls, body)
                reused = False
                if route == "/unload_lora_adapter":
                    ref = self.registry.unregister(req.lora_name)
                    req = cls(lora_name=req.lora_name, lora_id=ref.lora_id)
                else:
                    if route == "/load_lora_adapter_from_tensors" and req.upsert:
                        raise ValueError(
                            "upsert is not supported on the from_tensors route; use "
                            "/load_lora_adapter_from_distributed to refresh an adapter in place."
                        )
                    ref, reused = self.registry.register_or_reuse(
                        LoRARef(lora_name=req.lora_name, lora_path=req.to_ref().lora_path, pinned=req.pinned),
                        upsert=req.upsert,
                    )
                    req = cls(**dict(self.io.asdict(req), lora_id=ref.lora_id))
            except ValueError as e:
                return 400, {"success": False, "error_message": str(e), "loaded_adapters": None}
            out = self.call(req)[0]
            if out.success and route != "/unload_lora_adapter":
                (self.registry.refresh if reused else self.registry.register)(ref)
        answer = {
            "success": out.success,
            "error_message": out.error_message,
            "loaded_adapters": out.loaded_adapters,
        }
        return (200 if out.success else 400), answer

    def close(self):
        for conn in self.conns:
            try:
                conn.send("exit")
            except OSError:
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def make_handler(front):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body, text=False):
            data = body.encode() if text else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}") if n else {}

        def do_GET(self):
            self._route("GET", {})

        def do_POST(self):
            self._route("POST", self._body())

        def _route(self, method, body):
            path = self.path.split("?")[0]
            try:
                self._dispatch(method, path, body)
            except Exception as e:
                self._send(500 if front.dead else 400, {"success": False, "message": str(e)})

        def _dispatch(self, method, path, body):
            if path in front.io.LORA_ROUTES and method == "POST":
                return self._send(*front.lora_call(path, body))
            if path in front.io.ROUTES and method == "POST":
                return self._send(*front.weight_call(path, body))
            if path == "/update_weight_version":
                front.version = str(body["new_version"])
                return self._send(
                    200,
                    {
                        "success": True,
                        "message": f"Weight version updated to {front.version}",
                        "new_version": front.version,
                    },
                )
            if path in ("/pause_generation", "/continue_generation"):
                word = "paused" if path == "/pause_generation" else "continued"
                return self._send(200, {"message": f"Generation {word} successfully.", "status": "ok"})
            if path == "/flush_cache":
                return self._send(
                    200, "Cache flushed.\nPlease check backend logs for more details.\n", text=True
                )
            if path in ("/health", "/health_generate"):
                return self._send(503 if front.dead else 200, "", text=True)
            if path == "/get_weight_version":
                return self._send(200, {"weight_version": front.version})
            if path == "/get_server_info" or (path == "/server_info" and front.cell.state_controller):
                states = [o.internal_state for o in front.call(front.io.GetInternalStateReq())]
                return self._send(
                    200,
                    {
                        "tp_size": front.args.tp,
                        "weight_version": front.version,
                        "internal_states": states,
                        "version": front.cell.version,
                    },
                )
            if path == "/stand_in/state":
                return self._send(200, {"ranks": front.call("state"), "weight_version": front.version})
            self._send(404, {"detail": "Not Found"})

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="[front] %(name)s %(levelname)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # close the TP ranks on the way out
    front = Front(args)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(front))
    print(f"sglang stand-in listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        front.close()


if __name__ == "__main__":
    sys.exit(main())
