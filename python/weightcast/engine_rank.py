"""The shared core of the vLLM and SGLang plug-ins: one engine rank's Receiver over a model that
takes ``load_weights(iterable of (hf_name, full tensor))``, driven with the control plane's JSON
bodies. The plug-ins (weightcast.vllm, weightcast.sglang) only translate their engine's calls
into these; the torch reference engine (weightcast.torch_engine) runs the same Receiver, which is
how this core is tested where neither engine can be installed.

Session rule for clients that send no begin/end (plain SGLang clients, slime): each bucket
request is then its own session (staged, verified, committed), so a failed bucket still leaves
the model on complete previous tensors, never a half-written bucket.
"""

import json

from . import pickled
from .receiver import Receiver, load_weights_runner

# vLLM's weight-transfer dialect (docs/protocol.md, "vLLM's dialect"): weightcast-train sends our
# init_weights_update_group body as vLLM's `init_info` and each bucket request as `update_info`.
# The vLLM plug-in's backend (weightcast.vllm) and the torch engine's --api vllm routes both read
# them with these two functions.
INIT_GROUP_FIELDS = (
    "master_address",
    "master_port",
    "rank_offset",
    "world_size",
    "group_name",
    "backend",
    "rendezvous",
    "ranks",  # shard-aware broadcast: the engine ranks that join (docs/sharding.md)
)
INIT_OPTION_FIELDS = ("keep_delta_base",)


def _int_field(info, where, key):
    value = info.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}.{key}: must be an integer (got {type(value).__name__})")
    return value


def parse_init_info(info):
    """vLLM's ``init_info`` as weightcast-train sends it: our init_weights_update_group body
    (master_address, master_port, rank_offset, world_size, group_name, backend, rendezvous,
    ranks),
    plus our option keep_delta_base. Returns (group body, options); ValueError naming the field
    otherwise (vLLM answers it as a failed request)."""
    if not isinstance(info, dict):
        raise ValueError(f"init_info: must be a JSON object (got {type(info).__name__})")
    unknown = sorted(set(info) - set(INIT_GROUP_FIELDS) - set(INIT_OPTION_FIELDS))
    if unknown:
        raise ValueError(f"init_info: unknown field(s) {', '.join(unknown)}")
    if not isinstance(info.get("master_address"), str) or not info["master_address"]:
        raise ValueError("init_info.master_address: required, a non-empty string")
    for key in ("master_port", "rank_offset", "world_size"):
        _int_field(info, "init_info", key)
    body = {k: info[k] for k in INIT_GROUP_FIELDS if info.get(k) is not None}
    options = {"keep_delta_base": bool(info.get("keep_delta_base", False))}
    return body, options


def parse_update_info(info):
    """vLLM's ``update_info``: ("bucket", our update_weights_from_distributed body without
    session_id), or ("abort", reason) for {"abort": true, "reason"} (vLLM has no abort route, so
    weightcast-train sends its abort as an update). ValueError naming the field otherwise; the
    Receiver checks the rest of the bucket request as strictly as on our own route."""
    if not isinstance(info, dict):
        raise ValueError(f"update_info: must be a JSON object (got {type(info).__name__})")
    if info.get("abort") is True:
        return "abort", str(info.get("reason") or "aborted")
    if "ipc_handles_pickled" in info or "ipc_handles" in info:
        # vLLM's ipc backend shape (ipc_engine.py @02837425): names, dtype_names, shapes and one
        # handle per tensor; the handles are opened in the rank (weightcast.pickled.decode_ipc).
        lists = [info.get(key) for key in ("names", "dtype_names", "shapes")]
        for key, value in zip(("names", "dtype_names", "shapes"), lists):
            if not isinstance(value, list) or not value:
                raise ValueError(f"update_info.{key}: required, a non-empty list (ipc shape)")
        if not len(lists[0]) == len(lists[1]) == len(lists[2]):
            raise ValueError("update_info: names, dtype_names and shapes must have one entry per tensor")
        return "ipc", {k: v for k, v in info.items() if k != "session_id"}
    lists = [info.get(key) for key in ("names", "dtypes", "shapes")]
    for key, value in zip(("names", "dtypes", "shapes"), lists):
        if not isinstance(value, list):
            raise ValueError(f"update_info.{key}: required, a list")
    if not len(lists[0]) == len(lists[1]) == len(lists[2]):
        raise ValueError("update_info: names, dtypes and shapes must have one entry per tensor")
    body = {k: v for k, v in info.items() if k != "session_id"}
    return "bucket", body


class EngineRank:
    def __init__(
        self,
        model=None,
        *,
        engine_rank,
        rank_count,
        device=None,
        keep_delta_base=False,
        finish=None,
        runners=None,
        **receiver_options,
    ):
        """`model` (one "target" runner over model.load_weights) or explicit `runners`."""
        if runners is None:
            runners = [load_weights_runner(model, finish=finish)]
        self.receiver = Receiver(
            runners,
            engine_rank=engine_rank,
            rank_count=rank_count,
            device=device,
            keep_delta_base=keep_delta_base,
            **receiver_options,
        )
        self.engine_rank = engine_rank

    def init_group(self, body):
        body = json.loads(body) if isinstance(body, str) else body
        self.receiver.join(body)
        return (
            True,
            f"joined group '{body.get('group_name', 'weight_update_group')}' as group rank "
            f"{int(body.get('rank_offset', 0)) + self.engine_rank}",
        )

    def destroy_group(self, group_name="weight_update_group"):
        self.receiver.leave(group_name)
        return True, "left"

    def begin(self, selector="all", lora=None):
        """`lora`: begin_weight_update's "lora" object: an adapter session (docs/lora.md)."""
        return self.receiver.begin(selector, lora=lora)

    def update(self, body):
        """One bucket request; with no session open it is its own sessionless update, committed
        at once (the Receiver's session state says which, nothing here keeps it)."""
        body = json.loads(body) if isinstance(body, str) else body
        return True, f"received {self._in_round(body, self.receiver.receive)} bytes"

    def _in_round(self, body, receive):
        """receive(body) in the open session; with none open, in a sessionless one of its own:
        begun for the body's selector, committed at once with its weight_version, aborted when
        the receive fails. Answers what receive answered."""
        token = None
        if not self.receiver.in_session:
            token = self.receiver.begin(body.get("selector", "all"), sessionless=True)["session_id"]
            body = dict(body, session_id=token)
        try:
            size = receive(body)
        except Exception:
            if token is not None:
                self.receiver.abort("bucket failed")
            raise
        if token is not None:
            self.receiver.commit(body.get("weight_version"), session_id=token)
        return size

    def update_segment(self, body, handle_token=None):
        """One colocated bucket (update_weights_from_tensor, weightcast's segment form), inside
        the open session: staged like a distributed bucket, committed at end."""
        size = self.receiver.receive_segment(body, handle_token)
        return True, f"copied {size} bytes from the shared segment"

    def update_pickled(self, body):
        """One colocated bucket in the pickled form SGLang and Miles send (weightcast.pickled:
        read only when opted in): this rank decodes its own entry. Inside the open session; with
        none open (SGLang v0.5.x has no sessions) it is its own round, as in update()."""
        body = json.loads(body) if isinstance(body, str) else body

        def receive(b):
            return self.receiver.receive_local(*pickled.decode(b, self.engine_rank))

        return True, f"copied {self._in_round(body, receive)} bytes from the pickled bucket"

    def update_ipc(self, info):
        """vLLM's ipc shape inside the open session: this rank opens its handles (weightcast.pickled:
        only when opted in) and stages the tensors."""
        info = json.loads(info) if isinstance(info, str) else info
        return self._receive_local(*pickled.decode_ipc(info), "IPC handles")

    def _receive_local(self, local, data, source):
        return True, f"copied {self.receiver.receive_local(local, data)} bytes from {source}"

    def end(self, version=None):
        return self.receiver.commit(version)

    def abort(self, reason="aborted"):
        self.receiver.abort(reason)

    # vLLM's lifecycle, as its WeightTransferEngine calls it in every worker (weightcast.vllm):
    # start_weight_update (the worker has picked the model: "target", or "draft" after
    # /start_draft_weight_update), update_weights per bucket, finish_weight_update. vLLM's worker
    # (gpu_worker.py) leaves its update state only when the backend raises from update_weights,
    # and stays in it when finish raises: so the trainer's abort ({"abort": true}) drops the
    # staging and RAISES (VllmRoundAborted), a failed bucket drops it and raises, and either way
    # nothing of the round is committed. A round updates one model: buckets whose selector is
    # "all" load into it; a bucket for the other model is refused, naming the route to use.
    def vllm_start(self, model="target"):
        if model not in ("target", "draft"):
            raise ValueError(f"vllm_start: model must be 'target' or 'draft' (got {model!r})")
        if self.receiver.in_session:
            self.abort("a new update started before the previous one finished")
        self._vllm_round = model

    def vllm_update(self, update_info):
        kind, payload = parse_update_info(update_info)
        model = getattr(self, "_vllm_round", None)
        if kind == "abort":
            self._vllm_round = None
            if self.receiver.in_session:
                self.abort(payload)
            raise VllmRoundAborted(f"weightcast: round aborted ({payload}); no weights changed")
        if model is None:
            raise RuntimeError(
                "update_weights without start_weight_update (or after an abort or a " "failed bucket)"
            )
        selector = payload.get("selector") or model
        if selector not in ("all", model):
            route = "/start_draft_weight_update" if selector == "draft" else "/start_weight_update"
            self._vllm_round = None
            self.abort(f"a '{selector}' bucket in a {model} round")
            raise ValueError(
                f"update_info.selector: '{selector}' in a round that updates the {model} "
                f"model; start it with {route}"
            )
        if not self.receiver.in_session:
            self.begin(model)
        try:
            if kind == "ipc":
                return self.update_ipc(dict(payload, selector=model))
            return self.update(dict(payload, selector=model))
        except Exception:
            self._vllm_round = None
            self.abort("a bucket failed")
            raise

    def vllm_finish(self, version=None):
        model, self._vllm_round = getattr(self, "_vllm_round", None), None
        if model is None:
            raise RuntimeError(
                "finish_weight_update without start_weight_update (or after an abort " "or a failed bucket)"
            )
        if not self.receiver.in_session:
            self.begin(model)  # an update of no bucket still commits (and sets the version)
        return self.end(version)


class VllmRoundAborted(RuntimeError):
    """The trainer aborted a vLLM round: raised so vLLM's worker leaves its update state."""
