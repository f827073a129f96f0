"""The reference engine's front: its state (session, pause, weight version) and the operations
its routes call, each relayed to every worker.

Lifetime: one Engine per process; it starts the workers (Workers) and the session watchdog.
Threading: the HTTP front calls it from one thread per request. `sessions.mu` guards the session
(session.py); `model_lock` serializes what runs collectives across the workers (generate,
commit, the probes), while bucket requests of an open session run concurrently.
"""

import json
import threading
import time

from .. import _weightcast, pickled
from . import info, lora
from .session import Sessions
from .workers import WorkerError, Workers


class Engine:
    """The control plane's state: session ownership, pause, and the relays."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.workers = Workers(cfg)
        self.model_lock = threading.Lock()  # collectives across workers: one at a time
        self.sessions = Sessions(cfg["session_timeout"])
        self.paused = threading.Event()
        self.weight_version = "default"
        self.fail_bucket = None  # test hook: the bucket (sequence) refused once received
        self._counts = None
        self._shard_plans = None
        self.sessions.start_watchdog(lambda reason: self.workers.call_all("abort", reason), self.paused)

    def touch(self):
        self.sessions.touch()

    def runners(self):
        runners = [
            {
                "name": "target",
                "filters": info.TARGET_FILTER.split(","),
                "layout": "none",
                "tensor_count": self.tensor_count("target"),
                "seed": self.cfg["seed"],
            }
        ]
        if self.cfg["draft"]:
            runners.append(
                {
                    "name": "draft",
                    "filters": info.DRAFT_FILTER.split(","),
                    "layout": "none",
                    "tensor_count": self.tensor_count("draft"),
                    "seed": self.cfg["seed"],
                }
            )
        return runners

    def shard_plans(self):
        """Every worker's shard plan, in rank order, as announced (None: --shard-plan none)."""
        if self.cfg.get("shard_plan", "none") == "none":
            return None
        if self._shard_plans is None:
            with self.model_lock:
                plans = self.workers.call_all("shard_plan")
            if self.cfg.get("shard_plan_fault"):
                _break_plan(plans[0]["tensors"], *self.cfg["shard_plan_fault"].split(":", 1))
            self._shard_plans = plans
        return self._shard_plans

    def tensor_count(self, runner):
        if self._counts is None:
            self._counts = self.workers.call_all("info")[0]["tensor_count"]
        return self._counts.get(runner, 0)

    # --- groups and sessions -------------------------------------------------------------------
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
        adapter = body.get("lora")  # an adapter session (docs/lora.md); the Receiver checks it
        if adapter is not None and lora.check_targets(adapter):
            raise WorkerError({"status": 400, "message": lora.check_targets(adapter)})
        with self.sessions.mu:
            token = self.sessions.open(selector, body.get("holder"))
            try:
                answers = self.workers.call_all("begin", selector, adapter)
            except BaseException:
                self.sessions.discard()
                raise
        out = {
            "message": "session opened",
            "selector": selector,
            "session_id": token,
            "weight_version": answers[0]["weight_version"],
        }
        if body.get("holder"):
            out["holder"] = body["holder"]
        for key in ("runner_digest", "lora_version", "lora_digest"):  # delta bases
            held = _held(answers, key)
            if held:
                out[key] = held
        return out

    def update(self, body, implicit_ok=True):
        # Clients that open no session (SGLang's own, slime) get one per bucket: staged, verified
        # and committed by the workers before the answer (the plug-ins' rule, engine_rank.py).
        # vLLM's routes never do: a bucket outside start/finish (after an abort) is refused.
        implicit = implicit_ok and not self.sessions.is_open() and body.get("session_id") is None
        self.sessions.bucket_started(body.get("session_id"), check=not implicit)
        try:
            answers = self._receive(body, implicit)
        except WorkerError:
            self.abort_all("a bucket failed on a worker")
            raise
        finally:
            self.sessions.bucket_done()
        message = f"bucket received: {len(body.get('names', []))} tensors ({answers[0]['message']})"
        if body.get("weight_version") is not None:
            message += f". Weight version updated to {body['weight_version']}."
        return {"message": message}

    def update_from_tensor(self, body):
        """POST /update_weights_from_tensor: one colocated bucket inside the open session, in
        weightcast's segment form (every worker copies its copy out of the trainer's segment) or,
        only when the engine was started with WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1, in the
        pickled form SGLang and Miles send (each worker unpickles its own TP rank's entry:
        weightcast.pickled). Without the opt-in that form is a 400 naming the flag."""
        route = "update_weights_from_tensor"
        op = "receive_segment"
        if "serialized_named_tensors" in body:
            try:
                pickled.check(body)
            except pickled.PickledFormError as e:
                raise WorkerError({"status": 400, "message": str(e)}) from None
            if len(body["serialized_named_tensors"]) < self.cfg["tp"]:
                message = (
                    f"serialized_named_tensors: {len(body['serialized_named_tensors'])} entries for "
                    f"an engine of {self.cfg['tp']} TP ranks (one entry per rank)"
                )
                raise WorkerError({"status": 400, "message": message})
            op = "receive_pickled"
        self.sessions.bucket_started(body.get("session_id"), check=True, route=route)
        try:
            relayed = json.dumps({k: v for k, v in body.items() if k != "session_id"})
            args = (relayed,) if op == "receive_pickled" else (relayed, self.sessions.machine.token)
            answers = self.workers.call_all(op, *args)
        finally:
            self.sessions.bucket_done()
        return {"message": f"bucket copied ({answers[0]['message']})"}

    def update_ipc(self, info):
        """vLLM's ipc update_info inside the open round (weightcast.pickled.decode_ipc): each worker
        opens the handles and stages the tensors. Only with the opt-in; a failure aborts the round."""
        if not pickled.allowed():
            raise WorkerError({"status": 400, "message": pickled.ipc_refusal()})
        self.sessions.bucket_started(None, check=True, route="update_weights")
        try:
            answers = self.workers.call_all("receive_ipc", json.dumps(info))
        except WorkerError:
            self.abort_all("an ipc bucket failed on a worker")
            raise
        finally:
            self.sessions.bucket_done()
        return {"message": answers[0]["message"]}

    def _receive(self, body, implicit):
        # Ownership is checked by the caller; the workers' sessions are this front's own.
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
            message = f"injected failure of bucket {body['sequence']} after it was received"
            raise WorkerError({"status": 500, "message": message})
        return answers

    def abort_all(self, reason):
        self.sessions.close()
        self.workers.call_all("abort", reason)

    def set_version(self, body):
        if self.sessions.is_open():
            self.sessions.check_owner(body.get("session_id"), "update_weight_version")
        self.workers.call_all("set_version", body["new_version"])
        if not self.sessions.is_open():
            self.weight_version = body["new_version"]
        return {"message": f"weight_version '{body['new_version']}'"}

    def end(self, body):
        with self.sessions.mu:  # as update(): the watchdog decides under mu
            selector = self.sessions.close_owned(body.get("session_id"))
        with self.model_lock:
            answers = self.workers.call_all("commit", None, selector)
        versions = {a["weight_version"] for a in answers}
        if len(versions) != 1:
            raise WorkerError(
                {
                    "status": 500,
                    "message": f"workers committed different versions: {versions}",
                }
            )
        self.weight_version = answers[0]["weight_version"]
        slowest = max(a.get("seconds", 0) for a in answers)
        print(
            f"weightcast.reference: committed version {answers[0]['weight_version']} "
            f"(load and finish: {slowest:.3f} s on the slowest worker)",
            flush=True,
        )
        committed = "committed"
        if answers[0]["adapter"]:  # the base weights, their version and the draft unchanged
            committed = f"adapter '{answers[0]['adapter']}' committed"
        out = {
            "message": f"{committed} (slowest worker {slowest:.3f} s)",
            "weight_version": self.weight_version,
            "runners": answers[0]["runners"],
        }
        for key in ("runner_digest", "lora_digest"):
            held = _held(answers, key)
            if held:
                out[key] = held
        return out

    def abort(self, body):
        if not self.sessions.is_open():
            return {"message": "no session was open"}
        if not body.get("force"):
            self.sessions.check_owner(body.get("session_id"), "abort_weight_update")
        self.abort_all("aborted by abort_weight_update")
        return {"message": "session aborted; staged tensors discarded, previous weights kept"}

    # --- serving -------------------------------------------------------------------------------
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
        adapter = body.get("lora_name")  # SGLang's field: W + s * B @ A for this request
        if adapter is not None and not isinstance(adapter, str):
            raise WorkerError({"status": 400, "message": "lora_name: the name of a loaded adapter"})
        with self.model_lock:
            version = self.weight_version
            out = self.workers.call_all("generate", ids, n, adapter)[0]
        meta = {
            "weight_version": version,
            "prompt_tokens": len(ids),
            "completion_tokens": n,
        }
        return {"output_ids": out[len(ids) :], "meta_info": meta}

    def accept_length(self):
        if not self.cfg["draft"]:
            raise WorkerError({"status": 409, "message": "this engine holds no draft"})
        with self.model_lock:
            value = self.workers.call_all("accept_length")[0]
        return {
            "accept_length": value,
            "draft_tokens": 4,
            "weight_version": self.weight_version,
        }

    # --- adapters (docs/lora.md) ---------------------------------------------------------------
    def unload_adapter(self, body):
        """POST /unload_lora_adapter {lora_name}: requests that took it keep it."""
        name = body.get("lora_name")
        if not isinstance(name, str):
            raise WorkerError({"status": 400, "message": "lora_name: required"})
        if not all(self.workers.call_all("unload_adapter", name)):
            raise WorkerError({"status": 404, "message": f"lora_name: no adapter '{name}' is loaded"})
        return {"message": f"adapter '{name}' unloaded"}

    def load_adapter_from_tensors(self, body):
        """POST /load_lora_adapter_from_tensors, SGLang's route (INTEROP.md §9): {lora_name,
        config_dict (PEFT's), serialized_named_tensors (one pickle per TP rank), load_format,
        upsert} loads one whole adapter in one adapter session of its own: each worker unpickles
        its own entry (weightcast.pickled: only with WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1,
        else a 400 naming it), stages it with its digests, and the commit swaps the adapter in.
        A failure anywhere discards the session and keeps what was held. Miles' `selector`, when
        sent, scopes the session: anything but target is a 400."""
        name, config = body.get("lora_name"), body.get("config_dict")
        if not isinstance(name, str) or not isinstance(config, dict):
            raise WorkerError({"status": 400, "message": "lora_name and config_dict (PEFT's) are required"})
        try:
            pickled.check(body)
        except pickled.PickledFormError as e:
            raise WorkerError({"status": 400, "message": str(e)}) from None
        adapter = {"lora_name": name, "config": config, "op": "upsert" if body.get("upsert") else "load"}
        begun = self.begin({"selector": body.get("selector", "target"), "lora": adapter})
        token = begun["session_id"]
        bucket = {k: body[k] for k in ("serialized_named_tensors", "load_format") if k in body}
        try:
            self.update_from_tensor(dict(bucket, selector="target", session_id=token))
        except WorkerError:
            self.abort_all("the adapter's tensors could not be staged")
            raise
        return self.end({"session_id": token})

    def adapters(self):
        return self.workers.call_all("adapters")[0]

    def lora_checksum(self, name):
        answer = self.workers.call_all("lora_checksum", name)[0]
        if answer is None:
            raise WorkerError({"status": 404, "message": f"lora: no adapter '{name}' is loaded"})
        return answer

    def checksum(self, runner, recompute):
        if runner not in ("target", "draft") or (runner == "draft" and not self.cfg["draft"]):
            raise WorkerError({"status": 400, "message": f"runner: no runner '{runner}'"})
        with self.model_lock:
            answer = self.workers.call_all("checksum", runner, recompute)[0]
        return {
            "runner": runner,
            "weight_version": self.weight_version,
            "recomputed": recompute,
            **answer,
        }


def _held(answers, key):
    """What the workers hold, as one answer: None unless every worker answers `key`; their common
    value; or, for digests of workers holding different slices (shard-aware broadcast), one
    digest over every worker's in rank order, which changes when any worker's does. A version
    must be common."""
    values = [a[key] for a in answers]
    if not all(values):
        return None
    if all(v == values[0] for v in values):
        return values[0]
    if key.endswith("_version"):
        return None
    return _weightcast._combined_digest([(str(rank), v) for rank, v in enumerate(values)])


def _break_plan(tensors, kind, name):
    """The test hook --shard-plan-fault: rank 0's plan leaves `name` out, or reaches one index
    past its slice of it."""
    if name not in tensors:
        raise ValueError(f"--shard-plan-fault: the model has no tensor '{name}'")
    if kind == "hole":
        tensors.pop(name)
    elif kind == "overlap":
        tensors[name] = dict(tensors[name], length=tensors[name]["length"] + 1)
    else:
        raise ValueError(f"--shard-plan-fault: unknown kind '{kind}' (hole or overlap)")
