"""weightcast.Receiver: one engine rank's side of weight updates, for engines written in Python.

An engine creates one Receiver per rank (per tensor-parallel worker process) with its runners and
forwards the control plane's calls to it (the JSON bodies of the HTTP routes, unchanged)::

    import weightcast
    rx = weightcast.Receiver(
        runners=[weightcast.load_weights_runner(model)],  # "target", every name
        engine_rank=tp_rank, rank_count=tp_size)
    rx.join(init_body)                   # POST /init_weights_update_group
    rx.begin("target")                   # POST /begin_weight_update
    rx.receive(bucket_body)              # POST /update_weights_from_distributed (each bucket)
    rx.commit()                          # POST /end_weight_update: verify, load, finish

Nothing reaches the model before commit(). commit() checks every staged tensor's digest, then
calls each covered runner's ``begin``, its ``load`` once per layer (layers in order) and its
``finish``. The tensors handed to ``load`` are torch tensors that VIEW the received bytes (no
copy): they are valid only during the call; copy what you keep (``param.data.copy_(t)`` does).
A ``load`` that raises fails the commit with LoadError (.runner, .tensor); with deltas on the
receiver loads the previous version back into what it had already loaded. The version changes
only when every ``load`` and ``finish`` returned.
"""

import json

from . import _weightcast

ReceiverError = _weightcast.ReceiverError
SessionMachine = _weightcast.SessionMachine
LoadError = _weightcast.LoadError


def _torch():
    import torch  # imported lazily: the trainer side of the package needs no torch

    return torch


def as_tensor(name, dtype, shape, view):
    """A torch tensor over `view` (a memoryview of raw bytes), without copying."""
    torch = _torch()
    flat = torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
    return flat.view(getattr(torch, dtype)).view(shape)


class Runner:
    """A runner: `name` ("target" or "draft"), the names it takes (`filter`: comma-separated
    globs), and its callbacks. `load(list of (hf_name, tensor))` gets one layer at a time.
    `shape_of(hf_name)`: the full shape of a weight the runner holds (None if none), against which
    an adapter's A and B are checked (docs/lora.md); by default the shapes of what it loaded.
    """

    def __init__(self, name, load, filter="*", begin=None, finish=None, shape_of=None):
        self.name, self.load, self.filter = name, load, filter
        self.begin, self.finish = begin, finish
        self.shape_of = shape_of
        self._shapes = {}  # hf_name -> shape of what load() took

    def _spec(self):
        def load(items):
            pairs = _Tracked(
                [(name, as_tensor(name, dtype, shape, view)) for name, dtype, shape, view in items]
            )
            try:
                self.load(pairs)
            except Exception as e:
                # The C++ side names this tensor in its LoadError: the one being consumed.
                failure = RuntimeError(f"{type(e).__name__}: {e}")
                failure.weightcast_tensor = pairs.current
                raise failure from e
            for name, _, shape, _ in items:
                if name not in self._shapes:  # a weight's shape never changes
                    self._shapes[name] = list(shape)

        return {
            "name": self.name,
            "filter": self.filter,
            "load": load,
            "begin": self.begin,
            "finish": self.finish,
            "shape_of": self.shape_of or self._shapes.get,
        }


class _Tracked(list):
    """A layer's (name, tensor) pairs that remember the last one handed out by iteration."""

    current = None

    def __iter__(self):
        for pair in list.__iter__(self):
            self.current = pair[0]
            yield pair


def load_weights_runner(model, name="target", filter="*", finish=None):
    """A Runner that feeds `model.load_weights(iterable of (hf_name, tensor))` as vLLM and SGLang
    models take it: HF names, full unsharded tensors (each layer narrows its own shard).
    """
    return Runner(
        name,
        lambda pairs: model.load_weights(iter(pairs)),
        filter=filter,
        finish=finish,
    )


class Receiver:
    """One engine rank (see the module docstring). `device`: None for host memory, else a CUDA
    ordinal (NCCL groups receive there). `keep_delta_base`: keep the last committed tensors'
    bytes on the host so delta buckets can be applied (delta_base_bytes says how much).
    `ep_size` > 1 (with the model's `num_experts`): expert parallelism as vLLM and SGLang place
    experts (`expert_placement` "linear" or "round_robin"); this rank's EP rank is
    engine_rank // (rank_count // ep_size), and routed experts it does not hold are dropped as
    they arrive: never staged, never handed to `load` (`experts_dropped` counts them).
    """

    def __init__(
        self,
        runners,
        *,
        engine_rank=0,
        rank_count=1,
        device=None,
        keep_delta_base=False,
        init_timeout=60.0,
        comm_timeout=60.0,
        max_bucket_bytes=4 << 30,
        bind_address="127.0.0.1",
        store_token=None,
        single_copy=True,
        initial_version="default",
        ep_size=1,
        num_experts=0,
        expert_placement="linear",
    ):
        self._runners = list(runners)
        self._rx = _weightcast._Receiver(
            engine_rank=engine_rank,
            rank_count=rank_count,
            cuda_device=-1 if device is None else int(device),
            runners=[r._spec() for r in self._runners],
            keep_delta_base=keep_delta_base,
            init_timeout=init_timeout,
            comm_timeout=comm_timeout,
            max_bucket_bytes=max_bucket_bytes,
            bind_address=bind_address,
            store_token=store_token,
            single_copy=single_copy,
            initial_version=initial_version,
            ep_size=ep_size,
            num_experts=num_experts,
            expert_placement=expert_placement,
        )

    @staticmethod
    def _body(body):
        return body if isinstance(body, str) else json.dumps(body)

    def join(self, body):
        """init_weights_update_group's body (str or dict): joins as this rank."""
        self._rx.join(self._body(body))

    def leave(self, group_name="weight_update_group"):
        self._rx.leave(group_name)

    def begin(self, selector="all", holder=None, sessionless=False, lora=None):
        """Opens the session (the one state machine weightcast-engine keeps too). `sessionless`:
        the one-request session an engine opens itself for an update that arrives with none
        open; only calls carrying its session_id act on it. `lora`: begin_weight_update's
        "lora" object ({lora_name, config, op}, dict or JSON): an adapter session, whose commit
        swaps the adapter in and loads no runner (docs/lora.md). Returns {session_id,
        weight_version, runner_digest, lora_version, lora_digest}: pass the digests and
        lora_version on in the begin answer and the trainer may send deltas against them."""
        if lora is not None and not isinstance(lora, str):
            lora = json.dumps(lora)
        return self._rx.begin(selector, holder, sessionless, lora)

    def receive(self, body):
        """update_weights_from_distributed's body: receives and stages one bucket (blocks)."""
        return self._rx.receive(self._body(body))

    def receive_segment(self, body, handle_token=None):
        """update_weights_from_tensor's body in weightcast's segment form (docs/colocated.md):
        copies the bucket out of the trainer's shared segment into staging, in the open session.
        `handle_token`: what the trainer's handle carries, when not this receiver's session id
        (a worker behind an engine front that owns the session)."""
        return self._rx.receive_segment(self._body(body), handle_token)

    def receive_local(self, body, data):
        """A bucket already in this process's memory, in the open session: `body` holds its
        manifest and session fields (weightcast.pickled.decode), `data` its bytes (a contiguous
        uint8 tensor or buffer). Staged like a segment's bucket; digests computed in the copy."""
        if hasattr(data, "numpy"):
            data = data.numpy()
        return self._rx.receive_local(self._body(body), data)

    def set_version(self, version):
        self._rx.set_version(version)

    def commit(self, version=None, session_id=None):
        """Commits the session: {weight_version, runners, runner_digest, bytes_loaded, adapter,
        lora_digest} (the last two set by an adapter session's commit)."""
        return self._rx.commit(version, session_id)

    def abort(self, reason="aborted"):
        self._rx.abort(reason)

    def install(self, runner, tensors):
        """Initial weights of `runner` through the same load path: (name, tensor) pairs of
        contiguous CPU tensors. Records their digests (and the delta base when kept)."""
        items = []
        keep = []
        for name, t in tensors:
            t = t.detach().contiguous().cpu()
            keep.append(t)
            raw = t.view(-1).view(_torch().uint8).numpy() if t.numel() else b""
            items.append((name, str(t.dtype).replace("torch.", ""), list(t.shape), raw))
        self._rx.install(runner, items)

    def digests(self, runner="target"):
        return self._rx.digests(runner)

    def adapter(self, name):
        """The adapter held under `name` (None if none): lora_name, version, r, lora_alpha,
        scaling, target_modules, and tensors as {PEFT name: CPU tensor} (copies)."""
        held = self._rx.adapter(name)
        if held is None:
            return None
        torch = _torch()
        tensors = {}
        for tname, dtype, shape, raw in held["tensors"]:
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            tensors[tname] = flat.view(getattr(torch, dtype)).view(shape)
        return dict(held, tensors=tensors)

    def adapter_names(self):
        return self._rx.adapter_names()

    def unload_adapter(self, name):
        """Drops the adapter `name`; whether it was held."""
        return self._rx.unload_adapter(name)

    def adapter_checksum(self, name):
        """/weights_checksum?lora=NAME's answer for `name` (a dict), or None if not held."""
        text = self._rx.adapter_checksum(name)
        return None if text is None else json.loads(text)

    weight_version = property(lambda self: self._rx.weight_version)
    in_session = property(lambda self: self._rx.in_session)
    sessionless = property(lambda self: self._rx.sessionless)
    delta_base_bytes = property(lambda self: self._rx.delta_base_bytes)
    bytes_received = property(lambda self: self._rx.bytes_received)
    experts_dropped = property(lambda self: self._rx.experts_dropped)
    expert_placement = property(lambda self: self._rx.expert_placement)
    staging_pool_bytes = property(lambda self: self._rx.staging_pool_bytes)
    groups = property(lambda self: self._rx.groups)

    @property
    def keep_delta_base(self):
        return self._rx.keep_delta_base

    @keep_delta_base.setter
    def keep_delta_base(self, keep):
        self._rx.keep_delta_base = bool(keep)
