"""One SGLang matrix cell, end to end: the stand-in engine (engine.py: an HTTP front and 2 TP rank
processes, SGLang's plug-in framework loading weightcast.sglang through a real entry point) updated
by a Miles-style torch sender (this process: torch rank 0 hosting the c10d TCPStore, the group made
as SGLang's init_custom_process_group does, gloo, Miles' HTTP sequence, one async dist.broadcast
per tensor in `names` order).

Usage: run_cell.py CELL   (v0.5-dataclass | miles-v0.5.16 | main-weight-updater |
                           main-external-receivers; see standin/sglang/cells.py)

Rounds: a normal round (selector target), a draft round (selector draft), an aborted round (the
trainer gives up after its first bucket: destroys the group, joins a new one, ends the session)
followed by a normal round, a round whose load raises (a tensor the model has no parameter for),
and a last normal round; where the version has sessions, colocated rounds (pickled flattened
buckets on /update_weights_from_tensor, target then draft, then one whose entry is refused);
without sessions (v0.5.x), pickled buckets that each commit on their own into the target, then
a refused entry.
After each, every rank's target shard and the draft hold exactly the bytes
a reference model holds after loading what should have landed (bit for bit); each covered runner
began and post-processed once per session and an uncovered draft never; the engine accepts the
next round. Where the version has no sessions (v0.5.x) the draft round asserts SGLang's 404 and
an untouched draft, and buckets commit one by one (the aborted round keeps its first bucket).
Where the version has SGLang's run-time LoRA (sglang-miles), LoRA rounds as Miles sends them:
/load_lora_adapter_from_distributed (Miles' single-adapter sync, unload then load; its
multi-adapter sync, upsert) with one broadcast per tensor, and /load_lora_adapter_from_tensors
(one pickled entry per TP rank); refusals (a wrong-rank adapter, a load while a draft session is
open, an entry outside the allow-list, upsert on the tensors route) keep what SGLang held; after
each, every rank's LoRA manager holds exactly the adapters that should have landed and the base
and the draft are unchanged (no runner began or post-processed).
The external-receivers cell names weightcast.sglang.receiver in the init request and sends each
bucket as receiver_payload. Prints one line per round; exits non-zero on the first mismatch.
"""

import base64
import datetime
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # the interpreter the module was built for has no torch
    print(f"SKIP: torch does not import here ({e})")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "interop"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
from miles_style_trainer import call  # noqa: E402
from sglang_compat import custom_group, release_group  # noqa: E402
from expected import Expected, hexes  # noqa: E402
from miles_sender import flatten  # noqa: E402
from lora_sender import adapter  # noqa: E402

TP, SEED, GROUP = 2, 1, "miles-pp_0"
TIMEOUT = 60.0
SESSIONS = {
    "v0.5-dataclass": False,
    "miles-v0.5.16": True,
    "main-weight-updater": True,
    "main-external-receivers": True,
}
FACTORY = "weightcast.sglang.receiver"
LORA_CELLS = ("miles-v0.5.16",)  # the versions with SGLang's run-time LoRA routes (cells.py)
_MANAGER = [
    "SchedulerWeightUpdaterManager.begin_weight_update",
    "SchedulerWeightUpdaterManager.end_weight_update",
    "SchedulerWeightUpdaterManager.update_weights_from_tensor",
]
_GROUP = ["init_weights_update_group", "receive_weights_from_distributed", "destroy_weights_update_group"]
# The hooks each build must report as applied (the announce lists only those), in order.
HOOKED = {
    "v0.5-dataclass": [
        f"TpModelWorker.{m}"
        for m in (
            "init_weights_update_group",
            "destroy_weights_update_group",
            "update_weights_from_distributed",
            "update_weights_from_tensor",
        )
    ]
    + ["Scheduler.get_internal_state"],
    "miles-v0.5.16": [f"ModelRunner.{m}" for m in _GROUP]
    + _MANAGER
    + ["ModelRunner.load_lora_adapter_from_distributed", "TpModelWorker.load_lora_adapter_from_tensors"]
    + ["Scheduler.get_internal_state"],
    "main-weight-updater": [f"WeightUpdater.{m}" for m in _GROUP]
    + _MANAGER
    + ["SchedulerInternalStateController.get_internal_state"],
    "main-external-receivers": _MANAGER + ["SchedulerInternalStateController.get_internal_state"],
}


def fail(message):
    sys.exit(f"FAILED: {message}")


def _die_with_parent():
    """The engine's own process group, killed with this process however it ends."""
    import ctypes

    os.setsid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def plugin_metadata(root):
    """An installed distribution's metadata on sys.path: how SGLang finds plug-ins."""
    from weightcast import __version__

    info = os.path.join(root, f"weightcast-{__version__}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: weightcast\nVersion: {__version__}\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[sglang.srt.plugins]\nweightcast = weightcast.sglang:register\n")


class Engine:
    def __init__(self, cell, root):
        env = dict(os.environ, SGLANG_STANDIN_CELL=cell, PYTHONDONTWRITEBYTECODE="1")
        env["WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the colocated rounds' pickled buckets
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "standin"), root, env.get("PYTHONPATH", "")])
        if cell == "main-external-receivers":
            env["SGLANG_STANDIN_WEIGHT_UPDATE_RECEIVERS"] = FACTORY  # --weight-update-receivers
        self.log = open(os.path.join(root, "engine.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "engine.py"), "--tp", str(TP), "--seed", str(SEED)],
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            text=True,
            preexec_fn=_die_with_parent,
        )
        line = [None]
        reader = threading.Thread(
            target=lambda: line.__setitem__(0, self.proc.stdout.readline()), daemon=True
        )
        reader.start()
        reader.join(TIMEOUT)
        if not line[0] or "listening on" not in line[0]:
            self.close()
            fail(f"the engine did not start:\n{self.logs()}")
        self.url = line[0].split()[-1]

    def logs(self):
        self.log.seek(0)
        return self.log.read()[-6000:]

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def post(self, route, body=None, method="POST"):
        return call(self.url, route, body, method, TIMEOUT)

    def ok(self, route, body=None, method="POST"):
        status, text = self.post(route, body, method)
        if status != 200:
            fail(f"{route}: HTTP {status}: {text}\n{self.logs()}")
        return json.loads(text) if text.startswith("{") else text


class Trainer:
    """Torch rank 0 of the weights group, driving the engine as Miles does."""

    def __init__(self, engine, cell):
        self.engine, self.cell = engine, cell
        self.sessions = SESSIONS[cell]
        self.external = cell == "main-external-receivers"
        self.pg = self.store = None

    def connect(self):
        timeout = datetime.timedelta(seconds=TIMEOUT)
        self.store = dist.TCPStore("127.0.0.1", 0, 1 + TP, True, timeout, wait_for_workers=False)
        body = {
            "master_address": "127.0.0.1",
            "master_port": self.store.port,
            "rank_offset": 1,
            "world_size": 1 + TP,
            "group_name": GROUP,
            "backend": "gloo",
        }
        if self.external:
            body.update(receiver=FACTORY, receiver_init_payload={"backend": "gloo"})
        self.engine.post("/destroy_weights_update_group", {"group_name": GROUP})  # errors ignored
        answer = []
        t = threading.Thread(
            target=lambda: answer.append(self.engine.post("/init_weights_update_group", body))
        )
        t.start()
        self.pg = custom_group(self.store, 1 + TP, 0, GROUP, "gloo", timeout)
        t.join(TIMEOUT)
        if not answer or answer[0][0] != 200:
            fail(f"init_weights_update_group: {answer}\n{self.engine.logs()}")

    def disconnect(self):
        self.engine.ok("/destroy_weights_update_group", {"group_name": GROUP})
        release_group(self.pg)
        self.pg = self.store = None

    def begin(self, selector):
        self.engine.ok("/pause_generation", {"mode": "retract"})
        self.engine.ok("/flush_cache", method="GET")
        if self.sessions:
            self.engine.ok("/begin_weight_update", {"selector": selector})

    def bucket(self, tensors, selector, version):
        """One bucket request, then one broadcast per tensor (uint8 views: torch 1.13's gloo
        refuses bfloat16); returns (status, answer)."""
        metas = {
            "names": [n for n, _ in tensors],
            "dtypes": [str(t.dtype)[6:] for _, t in tensors],
            "shapes": [list(t.shape) for _, t in tensors],
        }
        body = {"group_name": GROUP, "flush_cache": False, "weight_version": version}
        if self.sessions:
            body["selector"] = selector
        if self.external:
            body.update(names=[], dtypes=[], shapes=[], receiver_payload=metas)
        else:
            body.update(metas)
        return self.post_and_broadcast("/update_weights_from_distributed", body, tensors)

    def post_and_broadcast(self, route, body, tensors):
        """POST `route` and, meanwhile, one async broadcast per tensor in order (as Miles)."""
        answer = []
        t = threading.Thread(target=lambda: answer.append(self.engine.post(route, body)))
        t.start()
        works = [
            dist.broadcast(t.contiguous().view(-1).view(torch.uint8), src=0, group=self.pg, async_op=True)
            for _, t in tensors
        ]
        for w in works:
            w.wait()
        t.join(TIMEOUT)
        return answer[0] if answer else (None, "no answer")

    def end(self, version):
        if version is not None:
            self.engine.ok("/update_weight_version", {"new_version": version, "abort_all_requests": False})
        status, text = (200, "") if not self.sessions else self.engine.post("/end_weight_update", {})
        self.engine.ok("/continue_generation", {})
        return status, text


def check(engine, expected, what, version=None):
    problems = expected.mismatches(engine.ok("/stand_in/state", method="GET"))
    if version is not None:
        held = engine.ok("/get_weight_version", method="GET")["weight_version"]
        if held != version:
            problems.append(f"weight_version {held!r}, expected {version!r}")
    if problems:
        fail(f"after {what}: " + "; ".join(problems[:8]) + f" ({len(problems)} in all)")
    print(f"ok: {what}", flush=True)


def halves(pairs):
    return [pairs[: len(pairs) // 2], pairs[len(pairs) // 2 :]]


def normal_round(trainer, expected, gen, version, selector="target", colocated=False):
    """Begin, two buckets, end. `colocated`: the buckets go as pickled flattened buckets on
    /update_weights_from_tensor (the engine runs with WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1;
    the plug-in's hook stages them in its session), else over the group."""
    pairs = expected.random(selector, gen)
    trainer.begin(selector)
    for bucket in halves(pairs):
        if colocated:
            body = tensor_body(bucket, version, selector)
            status, text = trainer.engine.post("/update_weights_from_tensor", body)
        else:
            status, text = trainer.bucket(bucket, selector, version)
        if status != 200:
            fail(f"round {version}: bucket answered {status}: {text}\n{trainer.engine.logs()}")
    status, text = trainer.end(version)
    if status != 200:
        fail(f"round {version}: end_weight_update answered {status}: {text}\n{trainer.engine.logs()}")
    expected.landed(selector, pairs)
    if trainer.sessions:
        expected.session(selector)


def draft_round(trainer, expected, gen, version):
    if trainer.sessions:
        normal_round(trainer, expected, gen, version, selector="draft")
        return
    # No sessions, no selector in this version: SGLang answers 404, and nothing reaches the draft.
    status, _ = trainer.engine.post("/begin_weight_update", {"selector": "draft"})
    if status != 404:
        fail(f"begin_weight_update on a version without sessions answered {status}, expected 404")


def aborted_round(trainer, expected, gen, version):
    """The trainer gives up after the first of two buckets: it destroys the group and joins a new
    one (Miles' reconnect), then ends the session so the engine takes the next round."""
    pairs = expected.random("target", gen)
    first, _ = halves(pairs)
    trainer.begin("target")
    status, text = trainer.bucket(first, "target", version)
    if status != 200:
        fail(f"aborted round: first bucket answered {status}: {text}")
    trainer.disconnect()
    trainer.connect()
    status, text = trainer.end(None)
    if trainer.sessions:
        if status != 400 or "destroyed" not in text:
            fail(
                f"aborted round: end_weight_update answered {status}: {text}, expected 400 naming the destroy"
            )
        expected.session("target")
    else:
        expected.landed("target", first)  # no sessions: each bucket committed on its own


def failing_round(trainer, expected, version):
    """A round whose load raises: a tensor the target has no parameter for."""
    bogus = [("model.layers.0.mlp.bogus_proj.weight", torch.zeros(8, dtype=torch.bfloat16))]
    trainer.begin("target")
    status, text = trainer.bucket(bogus, "target", version)
    if not trainer.sessions:
        if status != 400 or "bogus_proj" not in text:
            fail(f"failing round: bucket answered {status}: {text}, expected 400 naming the tensor")
        trainer.end(None)
        return
    if status != 200:
        fail(f"failing round: bucket answered {status}: {text}")
    status, text = trainer.end(None)
    if status != 400 or "bogus_proj" not in text:
        fail(f"failing round: end_weight_update answered {status}: {text}, expected 400 naming the tensor")
    expected.session("target")


def tensor_body(pairs, version, selector, entry=None):
    """update_weights_from_tensor as Miles sends it: one flattened bucket (miles_sender.flatten:
    multi-dtype uint8 views, byte indices, SGLang's metadata record) pickled and base64-encoded
    per TP rank (plain pickle: the bytes travel in the pickle, no shared-memory daemon),
    load_format flattened_bucket."""
    if entry is None:
        flat, metadata = flatten(pairs)
        entry = pickle.dumps({"flattened_tensor": flat, "metadata": metadata})
    return {
        "serialized_named_tensors": [base64.b64encode(entry).decode()] * TP,
        "load_format": "flattened_bucket",
        "flush_cache": False,
        "weight_version": version,
        "selector": selector,
    }


def sessionless_tensor_round(trainer, expected, gen, version):
    """Where SGLang has no sessions (v0.5.x): two pickled flattened buckets on
    /update_weights_from_tensor, each its own round into the target (committed as it lands), then
    an entry outside the allow-list: 400 naming it, nothing changes."""
    pairs = expected.random("target", gen)
    for bucket in halves(pairs):
        body = tensor_body(bucket, version, "target")
        del body["selector"]  # v0.5.x's request has none
        status, text = trainer.engine.post("/update_weights_from_tensor", body)
        if status != 200:
            fail(f"sessionless tensor round: bucket answered {status}: {text}\n{trainer.engine.logs()}")
        expected.landed("target", bucket)
    body = tensor_body(expected.random("target", gen), None, "target", entry=pickle.dumps(os.getcwd))
    del body["selector"]
    status, text = trainer.engine.post("/update_weights_from_tensor", body)
    if status != 400 or "getcwd" not in text:
        fail(
            f"sessionless tensor round: the refused entry answered {status}: {text}, expected 400 naming getcwd"
        )


def refused_tensor_round(trainer, expected, gen):
    """An entry that unpickles to something outside the allow-list (a function of the os module):
    400 naming it, the round discarded at end, nothing changes."""
    pairs = expected.random("target", gen)
    trainer.begin("target")
    status, text = trainer.engine.post(
        "/update_weights_from_tensor", tensor_body(pairs, None, "target", entry=pickle.dumps(os.getcwd))
    )
    if status != 400 or "getcwd" not in text:
        fail(f"refused tensor round: bucket answered {status}: {text}, expected 400 naming getcwd")
    status, text = trainer.end(None)
    if status != 400:
        fail(f"refused tensor round: end_weight_update answered {status}: {text}, expected 400")
    expected.session("target")


LORA_CONFIG = {
    "r": 4,
    "lora_alpha": 8,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def lora_tensors(step, rank=4):
    return adapter("tiny", SEED, step, rank, LORA_CONFIG["target_modules"])


def check_adapters(engine, held, what):
    """Every TP rank's LoRA manager holds exactly `held` ({name: [(tensor name, tensor)]})."""
    want = {name: hexes(pairs) for name, pairs in held.items()}
    for rank, state in enumerate(engine.ok("/stand_in/state", method="GET")["ranks"]):
        got = state.get("adapters", {})
        if got != want:
            differ = sorted(n for n in set(got) | set(want) if got.get(n) != want.get(n))
            fail(
                f"after {what}: rank {rank} holds adapters {sorted(got)}, expected {sorted(want)}; differ: {differ}"
            )
    print(f"ok: {what}", flush=True)


def expect_status(answer, status, needle, what):
    code, text = answer
    if code != status or needle not in text:
        fail(f"{what}: answered {code}: {text[:400]}, expected {status} naming {needle!r}")


def lora_distributed(trainer, name, pairs, upsert, broadcast=True):
    body = {
        "lora_name": name,
        "config_dict": LORA_CONFIG,
        "names": [n for n, _ in pairs],
        "dtypes": [str(t.dtype)[6:] for _, t in pairs],
        "shapes": [list(t.shape) for _, t in pairs],
        "group_name": GROUP,
        "pinned": False,
        "upsert": upsert,
    }
    if not broadcast:  # a load the engine refuses before receiving: nothing to send
        return trainer.engine.post("/load_lora_adapter_from_distributed", body)
    return trainer.post_and_broadcast("/load_lora_adapter_from_distributed", body, pairs)


def lora_tensors_body(name, pairs, entry=None):
    entry = pickle.dumps(dict(pairs)) if entry is None else entry
    return {
        "lora_name": name,
        "config_dict": LORA_CONFIG,
        "serialized_named_tensors": [base64.b64encode(entry).decode()] * TP,
    }


def lora_rounds(trainer, expected):
    """SGLang's run-time LoRA through the plug-in (module docstring). The base and the draft are
    checked unchanged after every round by `check`: an adapter load begins and post-processes no
    runner."""
    engine, held = trainer.engine, {}
    # Miles' single-adapter sync: unload (the first time: not held), then load.
    expect_status(
        engine.post("/unload_lora_adapter", {"lora_name": "policy"}), 400, "does not exist", "unload"
    )
    held["policy"] = lora_tensors(1)
    expect_status(lora_distributed(trainer, "policy", held["policy"], False), 200, "policy", "lora load")
    check_adapters(engine, held, "a LoRA load from the group")
    engine.ok("/unload_lora_adapter", {"lora_name": "policy"})
    held.pop("policy")
    check_adapters(engine, held, "its unload")
    held["policy"] = lora_tensors(2)
    expect_status(lora_distributed(trainer, "policy", held["policy"], False), 200, "policy", "lora reload")
    # Miles' multi-adapter sync: upsert in place.
    held["policy"] = lora_tensors(3)
    expect_status(lora_distributed(trainer, "policy", held["policy"], True), 200, "policy", "lora upsert")
    check_adapters(engine, held, "a LoRA upsert from the group")
    # A wrong-rank adapter: received whole, refused at the commit, naming a tensor.
    wrong = lora_tensors(4, rank=2)
    expect_status(lora_distributed(trainer, "policy", wrong, True), 400, "lora_A.weight", "wrong-rank upsert")
    check_adapters(engine, held, "a wrong-rank upsert (refused)")
    # A load while a draft session is open: adapters apply to the target.
    trainer.begin("draft")
    answer = lora_distributed(trainer, "policy", lora_tensors(5), True, broadcast=False)
    expect_status(answer, 400, "target model only", "a load during a draft session")
    status, text = trainer.end(None)
    if status != 200:
        fail(f"the draft session around the refused load: end answered {status}: {text}")
    expected.session("draft")
    check_adapters(engine, held, "a load during a draft session (refused)")
    check(engine, expected, "the LoRA rounds over the group: base and draft unchanged")
    # The tensors route: one pickled entry per TP rank.
    held["second"] = lora_tensors(6)
    expect_status(
        engine.post("/load_lora_adapter_from_tensors", lora_tensors_body("second", held["second"])),
        200,
        "second",
        "tensors load",
    )
    check_adapters(engine, held, "a LoRA load from tensors")
    body = lora_tensors_body("third", lora_tensors(7), entry=pickle.dumps(os.getcwd))
    expect_status(
        engine.post("/load_lora_adapter_from_tensors", body), 400, "getcwd", "an entry outside the allow-list"
    )
    body = dict(lora_tensors_body("second", lora_tensors(8)), upsert=True)
    expect_status(
        engine.post("/load_lora_adapter_from_tensors", body),
        400,
        "upsert is not supported",
        "upsert on tensors",
    )
    check_adapters(engine, held, "refused tensor loads")
    engine.ok("/unload_lora_adapter", {"lora_name": "second"})
    held.pop("second")
    check_adapters(engine, held, "the second adapter's unload")
    check(engine, expected, "the LoRA rounds from tensors: base and draft unchanged")


def run(cell, root):
    engine = Engine(cell, root)
    try:
        announced = engine.ok("/get_server_info", method="GET")["internal_states"]
        print(f"announce: {json.dumps(announced[0].get('weightcast'))}", flush=True)
        for state in announced:
            me = state.get("weightcast") or {}
            if me.get("hooked") != HOOKED[cell]:
                fail(f"the announce lists {me.get('hooked')}, expected the hooks applied: {HOOKED[cell]}")
            want = FACTORY if cell == "main-external-receivers" else "weightcast.Receiver"
            if me.get("receiver") != want:
                fail(f"the announce names receiver {me.get('receiver')!r}, expected {want!r}")
        trainer, expected = Trainer(engine, cell), Expected(TP, SEED)
        gen = torch.Generator().manual_seed(38)
        trainer.connect()
        normal_round(trainer, expected, gen, "1")
        check(engine, expected, "a normal round", "1")
        draft_round(trainer, expected, gen, "2")
        check(engine, expected, "a draft round")
        aborted_round(trainer, expected, gen, "3")
        check(engine, expected, "an aborted round")
        normal_round(trainer, expected, gen, "4")
        check(engine, expected, "the normal round after it", "4")
        failing_round(trainer, expected, "5")
        check(engine, expected, "a round whose load raises")
        normal_round(trainer, expected, gen, "6")
        check(engine, expected, "the normal round after it", "6")
        if trainer.sessions:
            normal_round(trainer, expected, gen, "7", colocated=True)
            check(engine, expected, "a colocated round (pickled flattened buckets)", "7")
            normal_round(trainer, expected, gen, "8", selector="draft", colocated=True)
            check(engine, expected, "a colocated draft round")
            refused_tensor_round(trainer, expected, gen)
            check(engine, expected, "a colocated round whose entry is refused")
        else:
            sessionless_tensor_round(trainer, expected, gen, "7")
            check(engine, expected, "colocated buckets without sessions, then a refused entry", "7")
        if cell in LORA_CELLS:
            lora_rounds(trainer, expected)
        return announced
    finally:
        engine.close()


def main():
    cell = sys.argv[1]
    root = tempfile.mkdtemp(prefix="wc-sglang-")
    try:
        plugin_metadata(root)
        announced = run(cell, root)
        hooked = announced[0]["weightcast"]["hooked"]
        print(f"PASSED {cell}: {len(hooked)} hooks applied", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
