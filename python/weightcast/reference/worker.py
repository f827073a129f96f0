"""One tensor-parallel worker of the torch reference engine (weightcast.reference).

Each worker process holds its TP shard of the target (weightcast.reference.model.TargetModel) and a
replica of the EAGLE-style draft, and receives weight updates through its own
weightcast.Receiver: the engine's HTTP front relays every control-plane call to every worker
over a pipe, and each worker joins the trainer's group as its own engine rank.
Requests run on threads (a receive blocks in C++ without the GIL, so the next bucket's request
is already queued when the current one lands); the front serializes the calls that run
collectives across workers (generate, commit, the accept-length probe).
"""

import os
import threading
import time
import traceback

import torch
import torch.distributed as dist

from .. import _weightcast
from ..engine_rank import EngineRank
from ..pickled import PickledFormError
from ..receiver import LoadError, ReceiverError, Runner
from .info import DRAFT_FILTER, TARGET_FILTER
from .lora import AdapterError, AdapterShards
from .model import DraftModel, Parallel, TargetModel, model_spec


def _tensor(dtype, shape, raw):
    """A tensor over `raw`, the generator's bytearray (_model_tensors), without a copy."""
    return torch.frombuffer(raw, dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)


class Worker:
    def __init__(self, rank, cfg):
        self.rank, self.cfg = rank, cfg
        self.tp = Parallel(rank, cfg["tp"], cfg.get("ep", 1))
        spec = model_spec(cfg["model"])
        self.spec = spec
        self.target = TargetModel(spec, self.tp)
        self.draft = DraftModel(spec) if cfg["draft"] else None
        self.fail_on = None  # test hook: a load of this name raises
        self.plan = None  # this rank's shard plan, once recorded (op_shard_plan)
        self.loaded_order = []  # names in the order load() saw them, for tests
        self.metas = {}
        # The adapters this worker applies, by name: its shards (reference/lora.py). Replaced as a
        # whole dict on every change, so a request that took one keeps it.
        self.adapters = {}
        runners = [Runner("target", self._loader(self.target), filter=TARGET_FILTER)]
        if self.draft is not None:
            # The fixed behaviour: post-processing runs when the draft loaded something.
            finish = None if cfg["legacy_finalize"] else self.draft.process_weights_after_loading
            runners.append(
                Runner(
                    "draft",
                    self._loader(self.draft),
                    filter=DRAFT_FILTER,
                    finish=finish,
                )
            )
        # The plug-ins' core (weightcast.engine_rank), so the torch engine tests it too.
        self.core = EngineRank(
            runners=runners,
            engine_rank=rank,
            rank_count=cfg["tp"],
            keep_delta_base=cfg["delta"],
            bind_address=cfg["bind_address"],
            store_token=cfg.get("store_token"),
            init_timeout=cfg["init_timeout"],
            comm_timeout=cfg["comm_timeout"],
        )
        self.rx = self.core.receiver
        for runner in ["target"] + (["draft"] if self.draft is not None else []):
            tensors = []
            for name, dtype, shape, raw in _weightcast._model_tensors(cfg["model"], runner, cfg["seed"], 0):
                tensors.append((name, _tensor(dtype, shape, raw)))
                self.metas[name] = (dtype, shape)
            self.rx.install(runner, tensors)
        if cfg["legacy_finalize"] and self.draft is not None:
            self.draft.process_weights_after_loading()  # its startup post-processing
        self.loaded_order.clear()
        self.full_shapes = {n: shape for n, (_, shape) in self.metas.items()}
        if cfg.get("shard_plan", "none") != "none":
            self.op_shard_plan()  # once every runner's tensors are known

    def _loader(self, model):
        def load(pairs):
            for name, tensor in pairs:
                if name == self.fail_on:
                    raise RuntimeError(f"injected load failure on '{name}'")
                self.loaded_order.append((name, tensor.data_ptr(), tensor.numel() * tensor.element_size()))
            model.load_weights(self._as_full(pairs))

        return load

    def _as_full(self, pairs):
        """The loader's (name, tensor) pairs with each slice this rank received (shard-aware
        broadcast, docs/sharding.md) standing in for its full tensor; whole tensors as they are."""
        if self.plan is None:  # no plan announced (or not yet: the initial weights, all whole)
            return iter(pairs)
        from ..shard_plan import sliced_pairs

        return sliced_pairs(pairs, self.plan, self.full_shapes)

    # --- operations the front relays ---------------------------------------------------------
    def op_join(self, body):
        self.core.init_group(body)

    def op_leave(self, name):
        self.core.destroy_group(name)

    def op_begin(self, selector, lora=None):
        return self.core.begin(selector, lora)

    def op_receive(self, body):
        ok, message = self.core.update(body)
        return {"message": message, "weight_version": self.rx.weight_version}

    def op_receive_segment(self, body, handle_token):
        ok, message = self.core.update_segment(body, handle_token)
        return {"message": message}

    def op_receive_pickled(self, body):
        ok, message = self.core.update_pickled(body)
        return {"message": message}

    def op_receive_ipc(self, info):
        ok, message = self.core.update_ipc(info)
        return {"message": message}

    def op_set_version(self, version):
        self.rx.set_version(version)

    def op_abort(self, reason):
        self.core.abort(reason)

    def op_commit(self, version, selector):
        start = time.monotonic()
        result = self.core.end(version)
        if result["adapter"]:
            # The Receiver swapped the adapter in; this worker's forward takes its shards.
            name = result["adapter"]
            self.adapters = {**self.adapters, name: AdapterShards(self.rx.adapter(name), self.target)}
        result["seconds"] = time.monotonic() - start
        if self.cfg["legacy_finalize"] and self.draft is not None and selector in ("all", "draft"):
            # The old behaviour: every covered runner's resident weights are post-processed again
            # at the end of the session, whether or not it loaded anything.
            self.draft.process_weights_after_loading()
            for entry in result["runners"]:
                if entry["runner"] == "draft":
                    break
            else:
                result["runners"].append({"runner": "draft", "tensors_loaded": 0, "tensors_transformed": 0})
            for entry in result["runners"]:
                if entry["runner"] == "draft":
                    entry["tensors_transformed"] = sum(1 for p in self.draft.parameters() if p.dim() == 2)
        return result

    def op_generate(self, ids, max_new_tokens, lora_name=None):
        adapter = None
        if lora_name is not None:
            adapter = self.adapters.get(lora_name)
            if adapter is None:
                raise AdapterError(404, f"lora_name: no adapter '{lora_name}' is loaded")
        return self.target.generate(ids, max_new_tokens, adapter)

    def op_unload_adapter(self, name):
        held = self.rx.unload_adapter(name)
        self.adapters = {k: v for k, v in self.adapters.items() if k != name}
        return held

    def op_adapters(self):
        """The held adapters as /server_info lists them."""
        out = []
        for name, shards in sorted(self.adapters.items()):
            sums = self.rx.adapter_checksum(name)
            if sums is not None:
                out.append(dict(shards.describe(), tensors=len(sums["tensors"]), digest=sums["digest"]))
        return out

    def op_lora_checksum(self, name):
        return self.rx.adapter_checksum(name)

    def op_accept_length(self):
        embed = self.target.full_tensor("model.embed_tokens.weight")
        head = self.target.full_tensor("lm_head.weight")
        fc = self.draft.logical("draft.fc.weight")
        raw = lambda t: t.contiguous().view(-1).view(torch.uint8).numpy()  # noqa: E731
        return _weightcast._spec_accept_length(
            str(fc.dtype).replace("torch.", ""),
            self.spec["vocab_size"],
            self.spec["hidden_size"],
            raw(embed),
            raw(head),
            raw(fc),
        )

    def op_checksum(self, runner, recompute):
        """Per-tensor digests: as received (the Receiver's record), or with `recompute` of the
        full tensors rebuilt from this engine's parameters (every worker takes part)."""
        digests = self.rx.digests(runner)
        if recompute:
            model = self.target if runner == "target" else self.draft
            raw = lambda t: t.contiguous().view(-1).view(torch.uint8).numpy()  # noqa: E731
            digests = {n: _weightcast._tensor_digest(raw(t)) for n, t in model.hf_tensors().items()}
        tensors = [
            {
                "name": n,
                "digest": d,
                "dtype": self.metas[n][0],
                "shape": self.metas[n][1],
            }
            for n, d in sorted(digests.items())
        ]
        return {
            "digest": _weightcast._combined_digest(sorted(digests.items())),
            "tensors": tensors,
        }

    def op_shard_plan(self):
        """This rank's shard plan (docs/sharding.md), recorded from the served models' own
        load_weights on meta stand-ins (shard_plan.record_live_plan: no weight is touched and no
        second model is built); the draft is a whole replica on every rank."""
        from ..shard_plan import record_live_plan

        if self.plan is not None:
            return self.plan
        metas = [(n, tuple(shape), getattr(torch, dtype)) for n, (dtype, shape) in self.metas.items()]
        plan = {"tensors": {}}
        for runner, model in (("target", self.target), ("draft", self.draft)):
            if model is not None:
                tensors = [t for t in metas if t[0].startswith("draft.") == (runner == "draft")]
                plan["tensors"].update(record_live_plan(model, tensors)["tensors"])
        self.plan = plan
        return plan

    def op_reset_peak(self):
        """Test hook: restarts the kernel's peak-RSS count (VmHWM) of this worker."""
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def op_info(self):
        status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
        kib = lambda key: int(status[key].split()[0]) * 1024  # noqa: E731
        return {
            "rss": kib("VmRSS"),
            "peak_rss": kib("VmHWM"),
            "weight_version": self.rx.weight_version,
            "delta_base_bytes": self.rx.delta_base_bytes,
            "in_session": self.rx.in_session,
            "bytes_received": self.rx.bytes_received,
            "staging_pool_bytes": self.rx.staging_pool_bytes,
            "draft_processed": self.draft.processed if self.draft else 0,
            "pid": os.getpid(),
            "fail_on": self.fail_on,
            "tensor_count": {r: len(self.rx.digests(r)) for r in self.runner_names()},
        }

    def runner_names(self):
        return ["target"] + (["draft"] if self.draft is not None else [])

    def op_save(self, path):
        """Test hook: this worker's parameters (its shards, as held) to `path`/rank<r>.pt."""
        state = {
            "target": {k: v.clone() for k, v in self.target.state_dict().items()},
            "draft": {k: v.clone() for k, v in self.draft.state_dict().items()} if self.draft else {},
            "lora": {name: shards.state() for name, shards in self.adapters.items()},
            "loaded_order": list(self.loaded_order),
        }
        torch.save(state, os.path.join(path, f"rank{self.rank}.pt"))

    def op_fail_load(self, name):
        self.fail_on = name


def _error(e):
    if isinstance(e, LoadError):
        return {
            "status": 500,
            "message": str(e),
            "runner": e.runner,
            "tensor": e.tensor,
        }
    if isinstance(e, (ReceiverError, PickledFormError, AdapterError)):
        return {"status": e.status, "message": str(e)}
    return {
        "status": 500,
        "message": f"{type(e).__name__}: {e}",
        "trace": traceback.format_exc(),
    }


def _enter_netns(name):
    """Moves this process's main thread into the network namespace `name` (`ip netns` names
    it): done first, before the worker opens a socket or starts a thread, which then all inherit
    it."""
    fd = os.open(os.path.join("/var/run/netns", name), os.O_RDONLY)
    try:
        if hasattr(os, "setns"):  # Python 3.12+
            os.setns(fd, os.CLONE_NEWNET)
            return
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def main(rank, cfg, conn, store_port):
    """Process entry: forms the TP group, builds the worker, serves the front's requests."""
    if cfg.get("worker_netns"):
        try:
            _enter_netns(cfg["worker_netns"][rank])
        except OSError as e:
            conn.send((None, False, {"status": 500, "message": f"worker {rank}: {e}"}))
            return
        cfg = dict(cfg, bind_address=cfg["worker_bind_addresses"][rank])
    torch.set_num_threads(1)
    store = dist.TCPStore(
        cfg["tp_host"],
        store_port,
        cfg["tp"],
        False,
        timeout=__import__("datetime").timedelta(seconds=cfg["init_timeout"]),
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=cfg["tp"])
    send_lock = threading.Lock()

    def reply(msg):
        with send_lock:
            conn.send(msg)

    try:
        worker = Worker(rank, cfg)
    except Exception as e:  # reported to the front, which exits with it
        reply((None, False, _error(e)))
        return
    reply((None, True, "ready"))

    def run(rid, op, args):
        try:
            reply((rid, True, getattr(worker, "op_" + op)(*args)))
        except Exception as e:
            reply((rid, False, _error(e)))

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        rid, op, args = msg
        threading.Thread(target=run, args=(rid, op, args), daemon=True).start()
    os._exit(0)  # daemon threads may be blocked in a receive; the front is gone
