"""The reference engine's route tables, one per API (--api weightcast, sglang, vllm), plus the
routes every API serves (/generate, /spec_accept_length, /weights_checksum) and the test hooks
(--debug-routes). A POST handler takes the JSON body (a dict, the query's parameters merged in),
a GET handler the parsed query ({name: [values]}); each answers a dict or raises WorkerError.

The table is the one list of what the engine serves: the HTTP front (server.py) dispatches from
it, and the security test walks it, so a route added here is covered the day it is added.
"""

from ..engine_rank import parse_init_info, parse_update_info
from . import info
from .workers import WorkerError


class RouteTable:
    """`posts` and `gets`: {path: handler}. Answers keep weightcast's shape ({"success", "message",
    ...}) unless plain: every route of vLLM's API (`vllm`, whose failures are FastAPI's
    {"detail"}), and the `plain` paths (SGLang's server info); the `ours` paths keep weightcast's
    shape whatever the API (the trainer reads them strictly)."""

    def __init__(self, posts, gets, vllm=False, plain=()):
        self.posts, self.gets, self.vllm, self.plain = posts, gets, vllm, set(plain)
        self.ours = set()

    def paths(self):
        return sorted(set(self.posts) | set(self.gets))

    def is_plain(self, path):
        return (self.vllm or path in self.plain) and path not in self.ours


def _ok(message):
    return lambda body: {"message": message}


def weightcast_routes(engine):
    """weightcast's routes, with SGLang's names (docs/protocol.md)."""
    posts = {
        "/init_weights_update_group": engine.init_group,
        "/destroy_weights_update_group": engine.destroy_group,
        "/begin_weight_update": engine.begin,
        "/update_weights_from_distributed": engine.update,
        "/update_weights_from_tensor": engine.update_from_tensor,
        "/update_weight_version": engine.set_version,
        "/end_weight_update": engine.end,
        "/abort_weight_update": engine.abort,
        "/pause_generation": lambda b: (
            engine.paused.set(),
            {"message": "generation paused"},
        )[1],
        "/continue_generation": lambda b: (
            engine.paused.clear(),
            {"message": "generation resumed"},
        )[1],
        "/flush_cache": _ok("cache flushed"),
        "/unload_lora_adapter": engine.unload_adapter,
        "/load_lora_adapter_from_tensors": engine.load_adapter_from_tensors,
    }
    gets = {
        "/health": lambda q: {"message": "ok"},
        "/server_info": lambda q: info.native_info(engine),
        "/get_server_info": lambda q: info.native_info(engine),
        "/flush_cache": lambda q: {"message": "cache flushed"},
        "/get_weight_version": lambda q: {"weight_version": engine.weight_version},
        "/model_info": lambda q: {
            "weight_version": engine.weight_version,
            "model_path": engine.cfg["model"],
        },
    }
    return RouteTable(posts, gets)


def sglang_routes(engine):
    """weightcast's routes, with /server_info in SGLang's shape (no "success")."""
    table = weightcast_routes(engine)
    table.gets["/server_info"] = table.gets["/get_server_info"] = lambda q: info.sglang_info(engine)
    table.plain |= {"/server_info", "/get_server_info"}
    return table


class VllmDialect:
    """vLLM's weight-transfer calls onto the engine's sessions, behind vLLM's worker state machine
    (the weight-update part of vllm/v1/worker/gpu_worker.py, upstream main) as weightcast's backend
    meets it inside vLLM (python/weightcast/vllm.py), so this engine is never kinder than vLLM:
    a start while an update is active, an update or a finish without one are refused (500, vLLM's
    messages); the update ends only when update_weights raises (a failed bucket, or the trainer's
    abort, which the backend answers by raising) or when finish succeeds (a finish that raises
    leaves it open). A round updates one model: /start_weight_update the target (vLLM ignores the
    body), /start_draft_weight_update the draft; buckets whose selector is "all" load into it, a
    bucket for the other model is refused. As the backend does, a start or a join drops staging left
    by a round vLLM had already ended. The bodies are read with the plug-in's own parsers
    (weightcast.engine_rank.parse_init_info / parse_update_info)."""

    def __init__(self, engine):
        self.engine = engine
        self.active = False  # the worker's _weight_update_active
        self.model = "target"

    @staticmethod
    def _raise(message):
        raise WorkerError({"status": 500, "message": message})

    def init(self, body):
        group, _ = parse_init_info(body.get("init_info"))  # keep_delta_base: this engine's --delta
        if self.engine.sessions.is_open() and not self.active:
            self.engine.abort_all("the trainer joined again before the previous round ended")
        self.engine.init_group(group)
        return {"message": "Weight transfer initialized"}

    def start(self, model):
        if self.active:
            self._raise(
                "start_weight_update called while a weight update is already active. "
                "Call finish_weight_update first."
            )
        if self.engine.sessions.is_open():
            self.engine.abort_all("a new update started before the previous one finished")
        self.engine.begin({"selector": model})
        self.active, self.model = True, model
        return {"message": "Draft weight update started" if model == "draft" else "Weight update started"}

    def update(self, body):
        if "update_info" not in body:
            raise WorkerError({"status": 400, "message": "Missing 'update_info' in request body"})
        if not self.active:
            self._raise("start_weight_update must be called before update_weights.")
        try:
            kind, payload = parse_update_info(body["update_info"])
            if kind == "abort":
                if self.engine.sessions.is_open():
                    self.engine.abort_all(payload)
                self._raise(f"weightcast: round aborted ({payload}); no weights changed")
            selector = payload.get("selector") or self.model
            if selector not in ("all", self.model):
                self.engine.abort_all(f"a '{selector}' bucket in a {self.model} round")
                self._raise(
                    f"update_info.selector: '{selector}' in a round that updates the {self.model} model"
                )
            if kind == "ipc":
                self.engine.update_ipc(dict(payload, selector=self.model))
            else:
                self.engine.update(dict(payload, selector=self.model), implicit_ok=False)
        except BaseException:
            self.active = False  # vLLM's worker leaves the update when the backend raises
            raise
        return {"message": "Weights updated"}

    def finish(self, body):
        if not self.active:
            self._raise("finish_weight_update called without a matching start_weight_update.")
        version = body.get("weight_version")
        if version is not None:  # vLLM records any string, "" included
            self.engine.set_version({"new_version": str(version)})
        self.engine.end({})  # raising leaves the update active, as vLLM's worker does
        self.active = False
        return {"message": "Weight update finished"}

    def pause(self, mode):
        if mode not in ("abort", "wait", "keep"):
            raise WorkerError(
                {
                    "status": 400,
                    "message": f"mode: 'abort', 'wait' or 'keep' (got '{mode}')",
                }
            )
        self.engine.paused.set()
        return {"status": "paused"}


def vllm_routes(engine):
    """vLLM's dev-mode routes, answered in vLLM's shapes ({"message"}, {"status"})."""
    vllm = VllmDialect(engine)
    posts = {
        "/init_weight_transfer_engine": vllm.init,
        "/start_weight_update": lambda b: vllm.start("target"),
        "/start_draft_weight_update": lambda b: vllm.start("draft"),
        "/update_weights": vllm.update,
        "/finish_weight_update": vllm.finish,
        "/pause": lambda b: vllm.pause(b.get("mode", "abort")),
        "/resume": lambda b: (engine.paused.clear(), {"status": "resumed"})[1],
        "/reset_prefix_cache": lambda b: {},
    }
    gets = {
        "/health": lambda q: {},
        "/server_info": lambda q: info.vllm_info(engine),
        "/get_world_size": lambda q: {"world_size": engine.cfg["tp"]},
        "/weight_info": lambda q: {"weight_version": engine.weight_version},
        "/is_paused": lambda q: {"is_paused": engine.paused.is_set()},
    }
    return RouteTable(posts, gets, vllm=True)


def _add_serving(table, engine):
    """The routes every API serves, answered in weightcast's shape."""
    table.posts["/generate"] = engine.generate
    table.gets["/spec_accept_length"] = lambda q: engine.accept_length()
    table.gets["/weights_checksum"] = lambda q: (
        engine.lora_checksum(q["lora"][0])
        if "lora" in q
        else engine.checksum(q.get("runner", ["target"])[0], q.get("recompute", ["0"])[0] in ("1", "true"))
    )
    table.ours |= {"/weights_checksum", "/spec_accept_length"}


def _add_debug(table, engine):
    """Test hooks (--debug-routes), answered in weightcast's shape."""
    call_all = engine.workers.call_all
    table.posts["/debug/save_params"] = lambda b: (
        call_all("save", b["path"]),
        {"message": "saved"},
    )[1]
    table.posts["/debug/reset_peak"] = lambda b: (
        call_all("reset_peak"),
        {"message": "reset"},
    )[1]
    table.posts["/debug/fail_load"] = lambda b: (
        call_all("fail_load", b.get("tensor")),
        {"message": "set"},
    )[1]
    table.posts["/debug/fail_bucket"] = lambda b: (
        setattr(engine, "fail_bucket", b.get("sequence")),
        {"message": "set"},
    )[1]
    table.gets["/debug/info"] = lambda q: {
        "workers": call_all("info"),
        "paused": engine.paused.is_set(),
        "session_open": engine.sessions.is_open(),
        "weight_version": engine.weight_version,
        "fail_bucket": engine.fail_bucket,
    }
    table.ours |= {path for path in table.paths() if path.startswith("/debug/")}


def route_table(engine):
    """The table the engine serves under its configuration (--api, --debug-routes)."""
    api = engine.cfg["api"]
    make = {
        "weightcast": weightcast_routes,
        "sglang": sglang_routes,
        "vllm": vllm_routes,
    }[api]
    table = make(engine)
    _add_serving(table, engine)
    if engine.cfg["debug_routes"]:
        _add_debug(table, engine)
    return table
