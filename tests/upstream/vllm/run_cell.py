"""One cell of the vLLM version matrix: weightcast.vllm (the real compiled module) inside the
stand-in of one vLLM version (tests/upstream/vllm/standin/, WEIGHTCAST_STANDIN_VLLM), driven by
weightcast-train (flavor vllm) over real processes: a TP-2 stand-in engine whose workers load
the harness model (fused qkv/gate_up, EAGLE-style draft).

    run_cell.py VERSION        (0.16.0, 0.25.0 or main; ctest: Upstream.vLLM_<version>)

Per way in (the `weightcast` backend where the version can host it, the worker extension on
every version): a normal round, a draft round, an aborted round (a bucket fails on one worker
after it was received: the trainer aborts) followed by a normal one, a round whose load raises,
then a last normal round, through the backend one round in vLLM's ipc shape, and adapter
rounds in the main cell (lora_rounds: through the extension vLLM's run-time LoRA loads what
weightcast committed; through the backend the trainer refuses the engine; the stand-in's LoRA
pieces do not differ between the cells, so the others do not repeat them). Through the
extension the workers announce shard plans recorded from the harness model's own loader, so
every target round sends each worker its slices only (checked by the bytes each received after
the first round); draft and adapter rounds go whole. After each round, every worker's target and
draft are compared bit for bit with the generator's tensors they must hold, post-processing must have run once per
model the round loaded and never on the other, and no worker may be left inside an update.
Where the version cannot host the backend, starting vLLM with it must fail with the plug-in's
message naming the minimum version. Expectations are computed here from the generator, not
from weightcast's digests.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "standin"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))  # lora_sender's adapter generator
sys.path.insert(0, HERE)

try:
    import torch
except ImportError as e:  # the matrix must not skip where the suite runs: fail loudly
    raise SystemExit(f"FAILED: torch does not import under {sys.executable} ({e})")

import harness_model  # noqa: E402
from lora_sender import adapter  # noqa: E402

VERSION = sys.argv[1]
os.environ["WEIGHTCAST_STANDIN_VLLM"] = VERSION
from vllm._matrix import VERSIONS  # noqa: E402

V = VERSIONS[VERSION]
SEED, TP = 7, 2
EXTENSION = "weightcast.vllm.WeightcastWorkerExtension"
SPECULATIVE = json.dumps({"method": "eagle", "model": "weightcast-tiny-draft"})


def _die_with_parent():
    """In each child: its own process group, and SIGKILL when this driver dies (a ctest timeout
    included), so no engine or trainer outlives the test."""
    import ctypes

    os.setsid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def plugin_site(root):
    """Package metadata declaring the plug-in's entry point, as `pip install ./python` does."""
    info = os.path.join(root, "weightcast_plugin_harness-0.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: weightcast-plugin-harness\nVersion: 0.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\nweightcast = weightcast.vllm:register\n")
    return root


class StandinVllm:
    """`VLLM_SERVER_DEV_MODE=1 vllm serve` of the stand-in, TP 2, in its own process group."""

    def __init__(self, tmp, env, *flags):
        self.port_file = os.path.join(tmp, f"port-{time.monotonic_ns()}")
        self.log_path = self.port_file + ".log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm.entrypoints.api_server",
                "--tensor-parallel-size",
                str(TP),
                "--port-file",
                self.port_file,
                "--speculative-config",
                SPECULATIVE,
                *flags,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        self.url = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and self.proc.poll() is None and not os.path.exists(self.port_file):
            time.sleep(0.1)
        if os.path.exists(self.port_file):
            with open(self.port_file) as f:
                self.url = f"http://127.0.0.1:{f.read().strip()}"

    def output(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def exit_code(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.log.close()

    def call(self, route, body):
        status, answer = self.status_of(route, body)
        assert status == 200, f"{route}: HTTP {status}: {answer}"
        return answer

    def status_of(self, route, body):
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            self.url + route,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)


def train(engine, seed, steps, *extra):
    mpirun = [
        os.environ.get("WEIGHTCAST_MPIEXEC") or "mpirun",
        *os.environ.get("WEIGHTCAST_MPIRUN_FLAGS", "").split(),
    ]
    argv = [
        *mpirun,
        "-np",
        "1",
        os.environ["WEIGHTCAST_TRAIN"],
        "--tp",
        "1",
        "--pp",
        "1",
        "--engines",
        engine.url,
        "--seed",
        str(seed),
        "--steps",
        str(steps),
        "--update-timeout-ms",
        "60000",
        "--group-timeout-ms",
        "60000",
        *extra,
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_die_with_parent
    )
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError("weightcast-train timed out:\n" + out)
    return proc.returncode, out


class Expect:
    """What every worker must hold: (seed, step) of the target's and the draft's tensors."""

    def __init__(self):
        self.target = self.draft = (SEED, 0)
        self.processed = {"target": 0, "draft": 0}


def check(engine, tmp, expect, what):
    answers = engine.call("/standin/call", {"method": "report", "args": [tmp]})["results"]
    full_draft = harness_model.draft_tensors(*expect.draft)
    for rank, answer in enumerate(answers):
        where = f"{what}: worker {rank}"
        assert not answer["active"], f"{where} is left inside a weight update (the engine is locked)"
        assert not answer["reloading"], f"{where}: {answer['reloading']} left mid layerwise reload (on meta)"
        assert (
            answer["processed"] == expect.processed
        ), f"{where}: post-processing runs {answer['processed']}, expected {expect.processed}"
        held = torch.load(os.path.join(tmp, f"rank{rank}.pt"))
        model = harness_model.new_target(rank, TP)
        model.load_weights(harness_model.generator_tensors("target", *expect.target))
        for name, param in model.named_parameters():
            assert torch.equal(
                held["target"][name].view(torch.uint8), param.detach().view(torch.uint8)
            ), f"{where}: target {name} is not (seed, step) {expect.target}"
        for name, tensor in full_draft.items():
            assert torch.equal(
                held["draft"][name].view(torch.uint8), tensor.view(torch.uint8)
            ), f"{where}: draft {name} is not (seed, step) {expect.draft}; it is {which(held['draft'], name)}"
    print(f"ok  {what}: target {expect.target}, draft {expect.draft}, processed {expect.processed}")


def sliced(engine, tmp):
    """Through the extension the workers announce shard plans recorded from the harness model's
    own loader (weightcast_shard_plan): after the first round each worker has received exactly
    what it keeps of the target (its slices and the replicated norms), about half of it, not the
    whole; check() has shown that what it keeps is right."""
    full = sum(t.numel() * t.element_size() for _, t in harness_model.generator_tensors("target", SEED, 1))
    answers = engine.call("/standin/call", {"method": "report", "args": [tmp]})["results"]
    for rank, answer in enumerate(answers):
        held = torch.load(os.path.join(tmp, f"rank{rank}.pt"))["target"]
        keeps = sum(t.numel() * t.element_size() for t in held.values())
        got = answer["bytes_received"]
        assert keeps <= got <= keeps * 1.02, f"worker {rank} received {got} bytes, keeps {keeps} of {full}"
        print(f"ok  extension: worker {rank} received {got} bytes of the target's {full} (keeps {keeps})")


def which(held, name):
    """Diagnosis of a mismatch: the generator step the tensor matches, if any."""
    for seed in range(SEED, SEED + 5):
        for step in range(4):
            t = harness_model.draft_tensors(seed, step)[name]
            if torch.equal(held[name].view(torch.uint8), t.view(torch.uint8)):
                return f"(seed, step) {(seed, step)}"
    return "none of the generator's (a layout applied twice or not at all?)"


def must(code_out, what, *needles):
    code, out = code_out
    assert code == 0, f"{what}: weightcast-train failed ({code}):\n{out}"
    for n in needles:
        assert n in out, f"{what}: '{n}' not in the trainer's output:\n{out}"


def must_fail(code_out, what, *needles):
    code, out = code_out
    assert code != 0, f"{what}: weightcast-train should have failed:\n{out}"
    for n in needles:
        assert n in out, f"{what}: '{n}' not in the trainer's output:\n{out}"


def refusals(engine):
    """vLLM's worker refusals, straight through the routes, and the plug-in's abort ending a
    started update (after a round: the backend has joined the trainer's group)."""

    def refused(route, body, needle):
        status, answer = engine.status_of(route, body)
        assert status == 500 and needle in answer["detail"], f"{route}: HTTP {status}: {answer}"

    refused("/finish_weight_update", {}, "finish_weight_update called without a matching start_weight_update")
    refused("/update_weights", {"update_info": {"abort": True}}, "start_weight_update must be called before")
    assert engine.status_of("/update_weights", {})[0] == 400, "update_weights without update_info"
    engine.call("/start_weight_update", {})
    refused("/start_weight_update", {}, "called while a weight update is already active")
    refused("/update_weights", {"update_info": {"abort": True, "reason": "probe"}}, "round aborted (probe)")
    engine.call("/start_weight_update", {})  # the abort ended the update: not locked
    refused("/update_weights", {"update_info": {"abort": True}}, "round aborted")
    print("ok  backend: vLLM's refusals; the trainer's abort ends a started update")


def rounds(engine, tmp, way):
    """The five rounds through one way in ("backend" or "extension")."""
    e = Expect()
    check(engine, tmp, e, f"{way}: start")
    must(train(engine, SEED, 1), f"{way}: normal round", "flavor vllm", "selector target")
    e.target, e.processed["target"] = (SEED, 1), 1
    check(engine, tmp, e, f"{way}: normal round")
    if way == "extension":
        sliced(engine, tmp)
    if way == "backend":
        refusals(engine)

    # Another seed: had the round landed in the target, its lm_head would show it.
    draft = train(engine, SEED + 4, 1, "--selector", "draft")
    if way == "backend" and not V.draft_target:
        # No /start_draft_weight_update before PR #46725: refused at start, nothing changes.
        must_fail(draft, f"{way}: draft round", "/start_draft_weight_update")
    else:
        must(draft, f"{way}: draft round", "selector draft")
        e.draft, e.processed["draft"] = (SEED + 4, 1), 1
    check(engine, tmp, e, f"{way}: draft round")

    engine.call("/standin/call", {"method": "fault", "args": ["bucket", way], "ranks": [1]})
    must_fail(train(engine, SEED + 1, 1), f"{way}: aborted round", "injected failure")
    check(engine, tmp, e, f"{way}: aborted round")
    must(train(engine, SEED, 2), f"{way}: round after the abort", "step 2/2")
    e.target, e.processed["target"] = (SEED, 2), 3
    check(engine, tmp, e, f"{way}: round after the abort")

    engine.call("/standin/call", {"method": "fault", "args": ["load", way]})
    must_fail(train(engine, SEED + 2, 1), f"{way}: round whose load raises", "injected load failure")
    check(engine, tmp, e, f"{way}: round whose load raises")
    must(train(engine, SEED + 3, 1), f"{way}: last round")
    e.target, e.processed["target"] = (SEED + 3, 1), 4
    check(engine, tmp, e, f"{way}: last round")
    if way == "backend":
        ipc_round(engine, SEED + 5)
        e.target, e.processed["target"] = (SEED + 5, 1), 5
        check(engine, tmp, e, f"{way}: ipc round")
    if VERSION == "main":  # the LoRA path (extension, worker, routes) is the same in every cell
        lora_rounds(engine, tmp, e, way)


LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def lora_rounds(engine, tmp, e, way):
    """Adapters through vLLM's run-time LoRA: weightcast-train --lora-rank sends the adapter in an
    adapter session (the worker extension), the commit writes it as a PEFT directory and vLLM
    loads it with /v1/load_lora_adapter (load_inplace). Each worker's LoRA manager must hold the
    generator's adapter of the last step, the base and the draft unchanged; a second run's later
    steps go as deltas against the adapter the workers hold. Through the backend
    (no adapter sessions in vLLM's weight-transfer API) the trainer refuses the engine up front."""
    argv = ["--lora-rank", "4", "--lora-targets", LORA_TARGETS, "--lora-name", "policy"]
    if way == "backend":
        must_fail(train(engine, SEED, 1, *argv), f"{way}: adapter round", "takes no LoRA adapters")
        check(engine, tmp, e, f"{way}: adapter round refused, nothing changed")
        return
    for steps in (1, 3):  # a first load, then load_inplace over it
        # The second run's steps 2 and 3 go as deltas against the adapter every worker's receiver
        # answers holding at begin (lora_version, lora_digest through collective_rpc).
        code_out = train(engine, SEED, steps, *argv, *(["--delta", "on"] if steps == 3 else []))
        must(code_out, f"{way}: adapter round", "lora policy version", f"step {steps}/{steps}")
        if steps == 3:
            for step in (2, 3):
                assert re.search(
                    rf"step {step}/3 lora .* delta_buckets [1-9]", code_out[1]
                ), f"{way}: adapter step {step} was not sent as deltas:\n{code_out[1]}"
        check(engine, tmp, e, f"{way}: adapter rounds, base and draft unchanged")
        want = harness_model.hexes(adapter(harness_model.PRESET, SEED, steps, 4, LORA_TARGETS.split(",")))
        answers = engine.call("/standin/call", {"method": "report", "args": [tmp]})["results"]
        for rank, answer in enumerate(answers):
            assert answer["adapters"] == {"policy": want}, (
                f"{way}: worker {rank}'s LoRA manager holds {sorted(answer['adapters'])}, not the adapter of "
                f"step {steps} (or its bytes differ)"
            )
        print(f"ok  {way}: vLLM's LoRA manager on every worker holds the adapter of step {steps}")
    # A rank vLLM would refuse after the commit (over --max-lora-rank 8): refused at begin.
    over = ["--lora-rank", "16"] + argv[2:]
    must_fail(train(engine, SEED, 4, *over), f"{way}: an adapter over --max-lora-rank", "--max-lora-rank 8")
    for rank, answer in enumerate(
        engine.call("/standin/call", {"method": "report", "args": [tmp]})["results"]
    ):
        assert answer["adapters"] == {"policy": want}, f"{way}: worker {rank}'s adapter changed"
    print(f"ok  {way}: an adapter over --max-lora-rank is refused at begin, vLLM's adapter unchanged")
    status, answer = engine.status_of("/v1/load_lora_adapter", {"lora_name": "policy", "lora_path": tmp})
    assert status == 400 and "load_inplace" in answer["error"]["message"], (status, answer)


def ipc_round(engine, seed):
    """One round in vLLM's ipc backend shape (vllm/distributed/weight_transfer/ipc_engine.py
    @02837425, http mode): update_info {names, dtype_names, shapes, ipc_handles_pickled}, each
    handle torch's reduce_tensor of a tensor filed under the worker's device key ("cpu" for these
    CPU workers), pickled and base64-encoded. The stand-in runs with
    WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1."""
    import base64
    import pickle

    from torch.multiprocessing.reductions import reduce_tensor

    full = harness_model.generator_tensors("target", seed, 1)
    info = {
        "names": [n for n, _ in full],
        "dtype_names": [str(t.dtype).split(".")[-1] for _, t in full],
        "shapes": [list(t.shape) for _, t in full],
        "ipc_handles_pickled": base64.b64encode(
            pickle.dumps([{"cpu": reduce_tensor(t)} for _, t in full])
        ).decode(),
    }
    engine.call("/start_weight_update", {})
    engine.call("/update_weights", {"update_info": info})
    engine.call("/finish_weight_update", {"weight_version": "ipc"})


def collision_refused():
    """The stand-in refuses a worker extension whose names collide with the worker's own."""
    from types import SimpleNamespace

    from vllm.v1.worker.worker_base import WorkerWrapperBase

    config = SimpleNamespace(
        parallel_config=SimpleNamespace(
            worker_extension_cls="harness_model.CollidingExtension", tensor_parallel_size=1
        ),
        weight_transfer_config=None,
    )
    try:
        WorkerWrapperBase(config, 0).init_worker(None)
    except ValueError as e:
        assert "conflicts with the worker extension class" in str(e), e
        print("ok  a colliding worker extension is refused")
        return
    raise AssertionError("a worker extension defining update_weights was accepted")


def main():
    collision_refused()
    with tempfile.TemporaryDirectory(prefix="wc-vllm-") as tmp:
        env = dict(
            os.environ,
            VLLM_SERVER_DEV_MODE="1",
            VLLM_PLUGINS="weightcast",
            WEIGHTCAST_STANDIN_MODEL="harness_model.build",
            WEIGHTCAST_STANDIN_HOOKS="harness_model",
            WEIGHTCAST_STANDIN_SEED=str(SEED),
            WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION="1",  # the ipc round's pickled handles
            PYTHONDONTWRITEBYTECODE="1",
        )
        env["PYTHONPATH"] = os.pathsep.join(
            [
                os.path.join(HERE, "standin"),
                plugin_site(os.path.join(tmp, "site")),
                HERE,
                env.get("PYTHONPATH", ""),
            ]
        )
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env["WEIGHTCAST_LORA_DIR"] = os.path.join(tmp, "adapters")  # removed with tmp: workers are killed
        model = os.path.join(tmp, "model")  # vLLM reads the model's HF config from its directory
        os.makedirs(model)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(harness_model.model_spec(harness_model.PRESET), f)
        backend = ["--model", model, "--weight-transfer-config", json.dumps({"backend": "weightcast"})]
        lora = ["--model", model, "--enable-lora", "--max-lora-rank", "8"]
        for way, flags in (("backend", backend), ("extension", lora + ["--worker-extension-cls", EXTENSION])):
            engine = StandinVllm(tmp, env, *flags)
            try:
                if way == "backend" and not V.free_backend:
                    code = engine.exit_code()
                    out = engine.output()
                    assert code not in (None, 0), f"vLLM {VERSION} started with backend weightcast:\n{out}"
                    for needle in (
                        "needs vLLM >= 0.25",
                        f"--worker-extension-cls {EXTENSION}",
                        "literal_error",
                    ):
                        assert needle in out, f"'{needle}' not in vLLM {VERSION}'s start failure:\n{out}"
                    print(f"ok  backend: vLLM {VERSION} refuses it at start, naming vLLM >= 0.25")
                    continue
                assert engine.url, f"the stand-in vLLM {VERSION} did not start:\n{engine.output()}"
                rounds(engine, tmp, way)
            except BaseException:
                print(engine.output())
                raise
            finally:
                engine.stop()
    print(f"vLLM {VERSION}: every check passed")


if __name__ == "__main__":
    main()
