"""Test engines: weightcast-engine processes on ephemeral ports, stopped when the block ends.

    with engines.running(2, ranks=[1, 2]) as urls: ...

The binary comes from $WEIGHTCAST_ENGINE (ctest sets it); each engine holds a target and a frozen
draft runner, both with the non-idempotent shuffle layout, as the C++ multi-process tests do.
"""

import contextlib
import os
import shlex
import signal
import subprocess
import sys
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


def start(ranks=1, layout="shuffle", extra=(), model="tiny", seed=5):
    argv = [
        engine_binary(),
        "--port",
        "0",
        "--ranks",
        str(ranks),
        "--model",
        model,
        "--seed",
        str(seed),
        "--draft",
        "--target-layout",
        layout,
        "--draft-layout",
        layout,
        *extra,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    deadline = time.monotonic() + 30
    for line in proc.stdout:
        if line.startswith(LISTENING):
            return proc, line[len(LISTENING) :].split()[0].rstrip("/")
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


def assert_hold(test, urls, tensors, version):
    """Every engine of `urls` holds `version` and, per tensor, XXH3-128 of the source's bytes
    (computed here by python-xxhash) as its target digest."""
    import xxhash

    for url in urls:
        held, held_version = checksums(url, "target")
        test.assertEqual(held_version, version)
        for name, t in tensors.items():
            test.assertEqual(held[name], xxhash.xxh3_128(source_bytes(t)).hexdigest(), f"{url} {name}")


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


def mpirun():
    """mpirun and its flags, from $WEIGHTCAST_MPIEXEC and $WEIGHTCAST_MPIRUN_FLAGS (ctest sets
    both)."""
    exe = os.environ.get("WEIGHTCAST_MPIEXEC") or "mpirun"
    return [exe, *shlex.split(os.environ.get("WEIGHTCAST_MPIRUN_FLAGS", ""))]


def run_rank(main, rank):
    """Runs one mpirun rank's main() and says it passed; any failure exits the process at once, so
    that no other rank is left waiting in a collective."""
    try:
        main()
        print(f"rank {rank} ok", flush=True)
    except BaseException:
        import sys
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)


def mpirun_argv(np, env_names, script):
    """The mpirun command line that runs `script` on `np` ranks, passing the environment variables
    `env_names` (and PYTHONPATH) on to every rank."""
    exported = [arg for name in ("PYTHONPATH", *env_names) for arg in ("-x", name)]
    return [*mpirun(), "-np", str(np), *exported, sys.executable, script]


def assert_engines_hold(urls, want, version):
    """Every engine's target holds the digests `want` (name -> digest) at `version`."""
    import json
    import urllib.request

    for url in urls:
        with urllib.request.urlopen(f"{url}/weights_checksum?runner=target", timeout=30) as r:
            body = json.load(r)
        held = {t["name"]: t["digest"] for t in body["tensors"]}
        assert body["weight_version"] == version, (url, body["weight_version"], version)
        for name, digest in want.items():
            assert held.get(name) == digest, (url, name, held.get(name), digest)
