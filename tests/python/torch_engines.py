"""The torch reference engine (python -m weightcast.reference) and weightcast-train as real
processes for tests, each in its own process group and killed with it when the block ends.

    with torch_engines.running([2, 1], seed=7) as engines: ...
    torch_engines.train(engines, steps=5, extra=["--verify"])
"""

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def _die_with_parent():
    import ctypes

    os.setsid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Engine:
    def __init__(self, tp, seed, extra=(), env=None, wait=True):
        """Starts the engine; `wait=False` returns at once (call wait_ready() before use)."""
        self.tp = tp
        self.dir = tempfile.mkdtemp(prefix="wc-torch-engine-")
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        argv = [
            sys.executable,
            "-m",
            "weightcast.reference",
            "--tp",
            str(tp),
            "--seed",
            str(seed),
            "--port-file",
            port_file,
            "--debug-routes",
            *extra,
        ]
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env=None if env is None else {**os.environ, **env},
        )
        self.port_file = port_file
        self.url = None
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=120):
        """Waits for the engine's port file (it is written once the workers are up)."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                output = self.output()
                self.stop()
                raise RuntimeError("torch engine did not start: " + output)
            time.sleep(0.1)
        with open(self.port_file) as f:
            self.url = f"http://127.0.0.1:{f.read().strip()}"

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        try:  # the workers, in the same process group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)  # its port file, log and saved weights

    def call(self, route, body=None, timeout=120):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + route,
            data=data,
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def ok(self, route, body=None):
        status, answer = self.call(route, body)
        if status != 200:
            raise AssertionError(f"{route}: HTTP {status}: {answer}")
        return answer

    def params(self):
        """Every worker's parameters as held: [{"target": {...}, "draft": {...}, ...}] by rank."""
        import torch

        self.ok("/debug/save_params", {"path": self.dir})
        return [torch.load(os.path.join(self.dir, f"rank{r}.pt")) for r in range(self.tp)]

    def generate(self, ids, n):
        return self.ok("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": n}})


@contextlib.contextmanager
def running(tps, seed, extra=(), env=None, extras=None):
    """Engines of TP sizes `tps`; `env`: variables added to each engine's environment; `extras`:
    each engine's own arguments (instead of `extra` for all)."""
    engines = []
    try:
        # All started before any is waited for: each spawns its workers, which import torch, and
        # on two cores two engines start in about the time of one.
        for tp, args in zip(tps, extras or [extra] * len(tps)):
            engines.append(Engine(tp, seed, args, env, wait=False))
        for e in engines:
            e.wait_ready()
        yield engines
    finally:
        for e in engines:
            e.stop()


def mpirun():
    exe = os.environ.get("WEIGHTCAST_MPIEXEC") or "mpirun"
    return [exe, *shlex.split(os.environ.get("WEIGHTCAST_MPIRUN_FLAGS", ""))]


def train_argv(engines, steps, seed, extra=(), tp=2, pp=2):
    binary = os.environ.get("WEIGHTCAST_TRAIN")
    if not binary:
        raise SystemExit("WEIGHTCAST_TRAIN must name the weightcast-train binary")
    return [
        *mpirun(),
        "-np",
        str(tp * pp),
        binary,
        "--tp",
        str(tp),
        "--pp",
        str(pp),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--engines",
        ",".join(e.url for e in engines),
        # The chain unless a test asks for the colocated path: these engines share the test's
        # host, which the trainer's default (auto) would send through shared memory.
        *([] if "--colocate" in extra else ["--colocate", "off"]),
        *extra,
    ]


def train(engines, steps, seed, extra=(), timeout=240, tp=2, pp=2):
    """Runs weightcast-train to the end: (exit code, output)."""
    proc = subprocess.Popen(
        train_argv(engines, steps, seed, extra, tp, pp),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_die_with_parent,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError("weightcast-train timed out:\n" + out)
    return proc.returncode, out


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: torch does not import under this interpreter ({e})")
        raise SystemExit(77)
