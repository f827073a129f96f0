"""The worker processes of the reference engine and the pipes to them.

`Workers` spawns one process per TP rank (worker.main), keeps the TP group's store, and runs an
operation on every worker with call_all(): a request id goes down each pipe, one reader thread
per pipe resolves the matching future. Threading: call_all() may run from many threads at once
(the HTTP front's request threads); each pipe has its own send lock.
"""

import itertools
import multiprocessing
import threading
import time
from concurrent.futures import Future

from .. import _weightcast


class WorkerError(Exception):
    """A failure to answer the client with: `status` is the HTTP status, `info` the worker's
    report ({"status", "message", ...})."""

    def __init__(self, info):
        super().__init__(info.get("message", "worker failed"))
        self.info = info
        self.status = info.get("status", 500)


def most_telling(errors):
    """One error for the client from the workers' [(rank, WorkerError)]: the most telling first.
    A worker whose peer left ("[peer: ...]") reports a consequence of that peer's own failure (its
    timeout, its refusal); a timeout may be the consequence of a refusal, a 409 of an abort. The
    others follow in the message, each naming its worker."""
    ordered = sorted(
        errors, key=lambda re: ("[peer: " in str(re[1]), re[1].status == 504, re[1].status == 409)
    )
    first = ordered[0][1]
    if len(ordered) == 1:
        return first
    others = "; ".join(f"worker {rank}: {e}" for rank, e in ordered[1:])
    return WorkerError(dict(first.info, message=f"{first} (also {others})"))


def _worker_main(*args):
    """A worker process's entry (worker.main): the worker module loads torch, which only the
    workers need; this process never imports it, so the engine is up a torch import sooner."""
    from . import worker

    worker.main(*args)


class Workers:
    """The worker processes and the pipes to them; call_all() runs one operation on each."""

    def __init__(self, cfg):
        self.cfg = cfg
        ctx = multiprocessing.get_context("spawn")
        # The TP group's store: a torch-compatible server on an ephemeral port, kept by this
        # process (torch's TCPStore clients in the workers connect to it).
        self.store = _weightcast._C10dStoreServer(cfg["tp_host"])
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.pending = {}
        self.procs, self.conns, self.send_locks = [], [], []
        for rank in range(cfg["tp"]):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(rank, cfg, child, self.store.port), daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
            self.send_locks.append(threading.Lock())
        self._wait_ready(time.monotonic() + cfg["init_timeout"] + 60)
        for rank, conn in enumerate(self.conns):
            threading.Thread(target=self._read, args=(rank, conn), daemon=True).start()

    def _wait_ready(self, deadline):
        for rank, conn in enumerate(self.conns):
            if not conn.poll(max(0.1, deadline - time.monotonic())):
                raise RuntimeError(f"worker {rank} did not start in time")
            _, ok, payload = conn.recv()
            if not ok:
                raise RuntimeError(f"worker {rank} failed to start: {payload}")

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
                message = f"{op}: no answer in {limit} s ({e!r})"
                errors.append((rank, WorkerError({"status": 504, "message": message})))
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
        self.store.stop()
