"""Test engines: weightcast-engine processes on ephemeral ports, stopped when the block ends.

    with engines.running(2, ranks=[1, 2]) as urls: ...

The binary comes from $WEIGHTCAST_ENGINE (ctest sets it); each engine holds a target and a frozen
draft runner, both with the non-idempotent shuffle layout, as the C++ multi-process tests do.
"""

import contextlib
import os
import signal
import subprocess
import time

LISTENING = "weightcast-engine listening on "


def engine_binary():
    path = os.environ.get("WEIGHTCAST_ENGINE")
    if not path or not os.access(path, os.X_OK):
        raise SystemExit("WEIGHTCAST_ENGINE must name the weightcast-engine binary")
    return path


def _die_with_parent():
    # An engine must not outlive a test process that crashed or was killed.
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start(ranks=1, layout="shuffle", extra=(), model="tiny"):
    argv = [engine_binary(), "--port", "0", "--ranks", str(ranks), "--model", model,
            "--seed", "5", "--draft", "--target-layout", layout, "--draft-layout", layout,
            *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    deadline = time.monotonic() + 30
    for line in proc.stdout:
        if line.startswith(LISTENING):
            return proc, line[len(LISTENING):].split()[0].rstrip("/")
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("engine did not start: " + " ".join(argv))


@contextlib.contextmanager
def running(count, ranks=None, layout="shuffle", extra=(), model="tiny"):
    procs = []
    try:
        urls = []
        for i in range(count):
            proc, url = start(ranks[i] if ranks else 1, layout, extra, model)
            procs.append(proc)
            urls.append(url)
        yield urls, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()


def checksums(url, runner="target"):
    """{name: digest} of one runner, read with the standard library only."""
    import json
    import urllib.request
    with urllib.request.urlopen(f"{url}/weights_checksum?runner={runner}", timeout=30) as r:
        body = json.load(r)
    return {t["name"]: t["digest"] for t in body["tensors"]}, body["weight_version"]


def require_torch():
    """Exit with ctest's skip code (77) when this interpreter cannot import torch."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: torch does not import under this interpreter ({e})")
        raise SystemExit(77)


def source_bytes(tensor):
    """The bytes a tensor holds, as the engines must receive them (a test-side copy)."""
    import torch
    if isinstance(tensor, torch.Tensor):
        return tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    import numpy
    return numpy.ascontiguousarray(tensor).tobytes()


def server_info(url):
    import json
    import urllib.request
    with urllib.request.urlopen(f"{url}/server_info", timeout=30) as r:
        return json.load(r)
