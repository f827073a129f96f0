"""LoRA adapters over weightcast, end to end (docs/lora.md): `mpirun -np 4 weightcast-train --tp 2
--pp 2 --lora-rank 4` updates a TP-2 torch reference engine and a 1-rank weightcast-engine with
adapters only, for 5 steps, with --verify, the adapter sent as deltas from step 2 on.

Expectations are computed here, independently of weightcast's digests: the trainer's adapter at
step k is the generator's bytes of each PEFT tensor name (weightcast._weightcast._fill_tensor),
each torch worker must hold exactly its shard of A or B (narrowed here with torch, following the
base layer's split), and /generate with the adapter must match a single-process forward written
here over the merged weights W + (alpha / r) * B @ A.
Run one case: test_lora.py Lora.test_trainer_update
"""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import engines as native  # noqa: E402
import torch_engines  # noqa: E402

torch_engines.require_torch()
import lora_sender  # noqa: E402
import torch  # noqa: E402
from test_torch_engine import PROMPT, SEED, full_tensors, reference_generate, shard, spec  # noqa: E402

from weightcast import _weightcast  # noqa: E402

RANK = 4
ALPHA = 2.0 * RANK  # weightcast-train's default: twice the rank
MODULES = {  # module -> (its parent, split of the base layer)
    "q_proj": ("self_attn", "column"),
    "k_proj": ("self_attn", "column"),
    "v_proj": ("self_attn", "column"),
    "o_proj": ("self_attn", "row"),
    "gate_proj": ("mlp", "column"),
    "up_proj": ("mlp", "column"),
    "down_proj": ("mlp", "row"),
}
TARGETS = ["--lora-rank", str(RANK), "--lora-targets", ",".join(MODULES)]
NAME = "weightcast"  # weightcast-train's default --lora-name


def adapter(step, seed=SEED):
    """{(layer, module): (A, B)} the trainer sends at `step`: the generator's bytes of each PEFT
    name (lora_sender.adapter, which the Miles-style sender sends too)."""
    out = {}
    for name, t in lora_sender.adapter("tiny", seed, step, RANK, list(MODULES)):
        parts = name.split(".")  # base_model.model.model.layers.<i>.<parent>.<module>.lora_<X>.weight
        out.setdefault((int(parts[4]), parts[6]), [None, None])["AB".index(parts[7][-1])] = t
    return {key: tuple(ab) for key, ab in out.items()}


def peft_name(layer, module, part):
    parent = MODULES[module][0]
    return f"base_model.model.model.layers.{layer}.{parent}.{module}.lora_{part}.weight"


def merged(base, ab):
    """The base's full tensors with every adapted weight replaced by W + (alpha / r) * B @ A."""
    out = dict(base)
    for (i, module), (a, b) in ab.items():
        name = f"model.layers.{i}.{MODULES[module][0]}.{module}.weight"
        out[name] = base[name].to(torch.float64) + (ALPHA / RANK) * (
            b.to(torch.float64) @ a.to(torch.float64)
        )
    return out


def digest(t):
    return _weightcast._tensor_digest(t.contiguous().view(-1).view(torch.uint8).numpy())


class NativeEngine:
    """A weightcast-engine process, as the trainer's helpers address an engine."""

    def __init__(self):
        self.proc, self.url = native.start(ranks=1, seed=SEED)

    call = torch_engines.Engine.call
    ok = torch_engines.Engine.ok

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Lora(unittest.TestCase):
    def assert_adapter_held(self, engines, ab, version, name=NAME):
        """Every engine reports exactly the adapter `ab` at `version` under `name` (its digests,
        by tensor name)."""
        want = {peft_name(i, m, p): digest(t) for (i, m), pair in ab.items() for p, t in zip("AB", pair)}
        for engine in engines:
            sums = engine.ok(f"/weights_checksum?lora={name}")
            self.assertEqual(sums["version"], version, engine.url)
            self.assertEqual({t["name"]: t["digest"] for t in sums["tensors"]}, want, engine.url)

    def assert_shards(self, held, ab, rank, tp):
        """Worker `rank` holds its shard of A or B for every module, as the base layer splits."""
        s = spec()
        kv_heads, hd = s["num_key_value_heads"], s["head_dim"]
        shards = held["lora"][NAME]
        self.assertEqual(len(shards), len(ab))
        for (i, module), (a, b) in ab.items():
            got_a, got_b = shards[f"{i}.{module}"]
            if MODULES[module][1] == "row":
                want_a, want_b = shard(a, 1, rank, tp), b
            elif module in ("k_proj", "v_proj") and kv_heads < tp:
                head = rank // (tp // kv_heads)
                want_a, want_b = a, b.narrow(0, head * hd, hd)
            else:
                want_a, want_b = a, shard(b, 0, rank, tp)
            self.assertTrue(torch.equal(got_a, want_a), f"worker {rank}: {module} A of layer {i}")
            self.assertTrue(torch.equal(got_b, want_b), f"worker {rank}: {module} B of layer {i}")

    def test_trainer_update(self):
        """tp 2 x pp 2 trainer ranks, 5 adapter steps with --verify and --delta on (steps 2-5 go
        as deltas against the adapter of the step before), to a TP-2 torch engine and a 1-rank
        weightcast-engine: the base and draft bit-identical, the adapter exact, each torch
        worker holding its shards, /generate with the adapter = the merged forward, without it =
        the base's."""
        with torch_engines.running([2], SEED) as (torch_engine,):
            engine = NativeEngine()
            try:
                before = torch_engine.params()
                native_before = {r: native.checksums(engine.url, r) for r in ("target", "draft")}
                code, out = torch_engines.train(
                    [torch_engine, engine], 5, SEED, [*TARGETS, "--verify", "--delta", "on"]
                )
                self.assertEqual(code, 0, out)
                self.assertRegex(out, r"lora weightcast rank 4 alpha 8 targets q_proj,k_proj,\S+: 14 tensors")
                for step in range(1, 6):
                    self.assertRegex(
                        out,
                        rf"step {step}/5 lora {NAME} version {step} selector target .* verified yes "
                        r"target_ok yes draft_ok yes ",
                    )
                    # From step 2 on, deltas against the adapter both engines confirmed holding.
                    deltas = r"0" if step == 1 else r"[1-9]\d*"
                    self.assertRegex(out, rf"step {step}/5 lora .* delta_buckets {deltas} ")
                # The base and the draft: bit-identical, their version unchanged.
                after = torch_engine.params()
                for rank in range(2):
                    for runner in ("target", "draft"):
                        for name, t in before[rank][runner].items():
                            self.assertTrue(torch.equal(after[rank][runner][name], t), f"{runner} {name}")
                for runner, sums in native_before.items():
                    self.assertEqual(native.checksums(engine.url, runner), sums, runner)
                # The adapter: exact on both engines, its shards on each torch worker.
                ab = adapter(5)
                self.assert_adapter_held([torch_engine, engine], ab, "5")
                for rank in range(2):
                    self.assert_shards(after[rank], ab, rank, 2)
                info = torch_engine.ok("/server_info")
                self.assertEqual([a["lora_name"] for a in info["lora_adapters"]], [NAME])
                self.assertEqual(info["weight_version"], "default")
                # Serving: with the adapter, the merged forward; without it, the base.
                base = full_tensors(0)
                with_adapter = torch_engine.ok(
                    "/generate",
                    {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8}, "lora_name": NAME},
                )["output_ids"]
                self.assertEqual(with_adapter, reference_generate(merged(base, ab), PROMPT, 8))
                without = torch_engine.generate(PROMPT, 8)["output_ids"]
                self.assertEqual(without, reference_generate(base, PROMPT, 8))
                self.assertNotEqual(with_adapter, without, "the adapter changed nothing: a weak test")
            finally:
                engine.stop()

    def test_draft_selector_is_refused(self):
        """After an adapter sent through the colocated path (--colocate on, --verify), an adapter
        session with selector draft (or all) is a 400 on both engines, and nothing opens or
        changes: the held adapter, the base's version, no session left open."""
        lora = {"lora_name": NAME, "config": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}}
        with torch_engines.running([2], SEED) as (torch_engine,):
            engine = NativeEngine()
            try:
                # The adapter goes through shared memory here: both engines share the trainer's host.
                code, out = torch_engines.train(
                    [torch_engine, engine],
                    1,
                    SEED,
                    ["--lora-rank", "4", "--lora-targets", "q_proj", "--colocate", "on", "--verify"],
                )
                self.assertEqual(code, 0, out)
                self.assertRegex(
                    out, r"step 1/1 lora weightcast version 1 .* verified yes .* path colocated "
                )
                held = {}
                for e in (torch_engine, engine):
                    held[e.url] = e.ok(f"/weights_checksum?lora={NAME}")["digest"]
                for e in (torch_engine, engine):
                    for selector in ("draft", "all"):
                        status, answer = e.call("/begin_weight_update", {"selector": selector, "lora": lora})
                        self.assertEqual(status, 400, answer)
                        self.assertIn("target", answer["message"])
                    info = e.ok("/server_info")
                    self.assertIsNone(info["session_selector"], e.url)
                    self.assertEqual(e.ok(f"/weights_checksum?lora={NAME}")["digest"], held[e.url])
                # The base version is untouched; a plain session still opens afterwards.
                self.assertEqual(torch_engine.ok("/server_info")["weight_version"], "default")
                opened = torch_engine.ok("/begin_weight_update", {"selector": "target"})
                torch_engine.ok("/abort_weight_update", {"session_id": opened["session_id"]})
            finally:
                engine.stop()

    def test_python_update_lora(self):
        """weightcast.DistributedUpdater.update_lora from Python, verify=True, delta="on", to a
        1-rank weightcast-engine and a TP-2 torch engine: the adapter's version counts per name,
        step 2 goes as deltas, step 3 whole after one engine unloaded the adapter, every engine
        holds it exactly, the torch engine serves it, the base is untouched; misuse is refused
        before any engine is asked."""
        import weightcast

        config = {"r": RANK, "lora_alpha": ALPHA, "target_modules": list(MODULES)}
        with torch_engines.running([2], SEED) as (torch_engine,):
            engine = NativeEngine()
            try:
                base_sums = native.checksums(engine.url, "target")
                urls = [torch_engine.url, engine.url]
                with weightcast.DistributedUpdater(
                    engines=urls, selector="all", verify=True, colocate="off", delta="on"
                ) as updater:
                    for step in (1, 2, 3):
                        if step == 3:  # one engine loses the adapter: the next step goes whole
                            engine.ok("/unload_lora_adapter", {"lora_name": "py"})
                        ab = adapter(step)
                        tensors = {
                            peft_name(i, m, p): t for (i, m), pair in ab.items() for p, t in zip("AB", pair)
                        }
                        report = updater.update_lora("py", tensors, config)
                        self.assertTrue(report.ok, report.error)
                        self.assertTrue(report.verified)
                        self.assertEqual(
                            (report.adapter, report.version, report.selector), ("py", str(step), "target")
                        )
                        # Step 2: deltas against step 1's adapter, which both engines hold.
                        self.assertEqual(report.delta_buckets > 0, step == 2, f"step {step}")
                    with self.assertRaises(weightcast.InputError):
                        updater.update_lora("py", {"model.norm.weight": torch.zeros(4)}, config)
                    with self.assertRaises(weightcast.ConfigError):
                        updater.update_lora("py", tensors, config, op="replace")
                self.assert_adapter_held([torch_engine, engine], ab, "3", name="py")
                body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8}, "lora_name": "py"}
                self.assertEqual(
                    torch_engine.ok("/generate", body)["output_ids"],
                    reference_generate(merged(full_tensors(0), ab), PROMPT, 8),
                )
                self.assertEqual(native.checksums(engine.url, "target"), base_sums)
            finally:
                engine.stop()

    def test_miles_lora_sender(self):
        """SGLang's /load_lora_adapter_from_tensors as Miles drives it (tests/python/lora_sender.py,
        a process of its own: unload, then one load of per-TP-rank pickles): without the opt-in a
        400 naming it and no adapter; opted in, 2 steps land exactly on a TP-2 torch engine, which
        serves them (= the merged forward) with the base and draft bit-identical; Miles'
        selector "draft" on the request is a 400 that keeps the adapter."""
        sender = os.path.join(os.path.dirname(__file__), "lora_sender.py")

        def send(engine, *extra):
            argv = [sys.executable, sender, "--engine", engine.url, "--tp-size", "2", "--seed", str(SEED)]
            # Output to a file, not a pipe: torch's shared-memory manager (the file_system
            # strategy), a daemon the sender starts, keeps its inherited descriptors.
            with tempfile.TemporaryFile("w+") as out:
                code = subprocess.run(
                    [*argv, *extra], stdout=out, stderr=subprocess.STDOUT, timeout=300
                ).returncode
                out.seek(0)
                return code, out.read()

        with torch_engines.running([2], SEED) as (engine,):
            code, out = send(engine, "--expect", "400")
            self.assertEqual(code, 0, out)
            self.assertIn("WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION", out)
            self.assertEqual(engine.ok("/server_info")["lora_adapters"], [])
        opt_in = {"WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION": "1"}
        with torch_engines.running([2], SEED, env=opt_in) as (engine,):
            before = engine.params()
            code, out = send(engine, "--steps", "1:2", "--rank", str(RANK), "--alpha", str(ALPHA))
            self.assertEqual(code, 0, out)
            self.assertIn("adapter 'miles' committed", out)
            ab = adapter(2)
            self.assert_adapter_held([engine], ab, "", name="miles")
            after = engine.params()
            for rank in range(2):
                for runner in ("target", "draft"):
                    for name, t in before[rank][runner].items():
                        self.assertTrue(torch.equal(after[rank][runner][name], t), f"{runner} {name}")
                self.assertEqual(len(after[rank]["lora"]["miles"]), len(ab))
            body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8}, "lora_name": "miles"}
            answer = engine.ok("/generate", body)["output_ids"]
            self.assertEqual(answer, reference_generate(merged(full_tensors(0), ab), PROMPT, 8))
            # Miles' selector on the request: draft is refused and the adapter stays; so is a
            # second load of the held name (SGLang's load, not an upsert): a 409 at commit.
            code, out = send(engine, "--steps", "3", "--selector", "draft", "--no-unload", "--expect", "400")
            self.assertEqual(code, 0, out)
            self.assertIn("target", out)
            code, out = send(engine, "--steps", "3", "--no-unload", "--expect", "409")
            self.assertEqual(code, 0, out)
            self.assert_adapter_held([engine], ab, "", name="miles")
            self.assertEqual(engine.ok("/generate", body)["output_ids"], answer)
            self.assertFalse(engine.ok("/debug/info")["session_open"])

    def test_engines_without_adapters_are_refused(self):
        """weightcast-train --lora-rank against an engine whose /server_info lists no
        lora_adapters (the torch engine in SGLang's shape) stops at setup, naming the engine,
        before any session opens there."""
        with torch_engines.running([1], SEED, ["--api", "sglang"]) as (engine,):
            code, out = torch_engines.train([engine], 1, SEED, TARGETS, tp=1, pp=1)
            self.assertNotEqual(code, 0, out)
            self.assertIn(f"engine {engine.url} takes no LoRA adapters", out)
            self.assertNotIn("step 1/1", out)
            self.assertFalse(engine.ok("/debug/info")["session_open"])

    def test_failed_load_keeps_the_previous_adapter(self):
        """A second adapter whose load fails half-way (the engine fails its third bucket after
        receiving it) leaves the first in place: its digests, its version, and what /generate
        answers with it; the trainer reports the failure."""
        with torch_engines.running([2], SEED) as (torch_engine,):
            code, out = torch_engines.train([torch_engine], 1, SEED, TARGETS)
            self.assertEqual(code, 0, out)
            ab = adapter(1)
            self.assert_adapter_held([torch_engine], ab, "1")
            body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8}, "lora_name": NAME}
            answer = torch_engine.ok("/generate", body)["output_ids"]
            torch_engine.ok("/debug/fail_bucket", {"sequence": 2})
            # Another run (another seed: other bytes) in small buckets, so the failure lands
            # half-way through the adapter.
            code, out = torch_engines.train([torch_engine], 1, SEED + 1, [*TARGETS, "--bucket-bytes", "4K"])
            self.assertNotEqual(code, 0, out)
            self.assertIn("FAILED", out)
            self.assert_adapter_held([torch_engine], ab, "1")
            self.assertEqual(torch_engine.ok("/generate", body)["output_ids"], answer)
            self.assertFalse(torch_engine.ok("/debug/info")["session_open"])


if __name__ == "__main__":
    unittest.main()
