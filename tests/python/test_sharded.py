"""Shard-aware broadcast (docs/sharding.md), end to end with the torch reference engine.

Each TP worker announces the plan its model's own load_weights follows (--shard-plan recorded);
the trainer checks every plan against the tensors each stage sends before any bucket goes out,
then broadcasts each shard class's slices on that class's own group, all classes at once.
Expectations are computed here with torch's narrow, independently of the plans.
Run one case: test_sharded.py Sharded.test_trainer_update
"""

import contextlib
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import engines as native  # noqa: E402
import torch_engines  # noqa: E402

torch_engines.require_torch()
import torch  # noqa: E402
from test_torch_engine import PROMPT, full_tensors, reference_generate, spec  # noqa: E402

from weightcast import _weightcast  # noqa: E402

SEED = 7  # test_torch_engine's: full_tensors() draws with it


def narrowed(full, name, rank, tp):
    """What rank `rank` of a TP-`tp` engine keeps of HF tensor `name`, by torch's narrow: KV heads
    shared by tp / kv ranks when there are more ranks than heads."""
    s = spec()
    t = full[name]
    column = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
    if any(k in name for k in ("k_proj", "v_proj")) and tp > s["num_key_value_heads"]:
        head = rank // (tp // s["num_key_value_heads"])
        return t.narrow(0, head * s["head_dim"], s["head_dim"])
    for dim, parts in ((0, column), (1, ("o_proj", "down_proj"))):
        if any(p in name for p in parts):
            size = t.shape[dim] // tp
            return t.narrow(dim, rank * size, size)
    return t  # norms: replicated


def expected_worker(full, rank, tp):
    """Worker `rank`'s parameters, fused as the reference model holds them."""
    out = {
        n: narrowed(full, n, rank, tp)
        for n in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
    }
    for i in range(spec()["num_hidden_layers"]):
        p = f"model.layers.{i}."
        part = lambda n: narrowed(full, p + n, rank, tp)  # noqa: E731
        out[p + "self_attn.qkv_proj.weight"] = torch.cat([part(f"self_attn.{x}_proj.weight") for x in "qkv"])
        out[p + "mlp.gate_up_proj.weight"] = torch.cat([part(f"mlp.{x}_proj.weight") for x in ("gate", "up")])
        for n in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            out[p + n] = part(n)
        out[p + "post_attention_layernorm.weight"] = part("post_attention_layernorm.weight")
    return out


def nbytes(t):
    return t.numel() * t.element_size()


def moe_full(step):
    """moe-tiny's target tensors at `step` (the trainer's, seed SEED): tiny's attention, norms and
    embeddings, and 8 experts per layer with a router instead of the dense MLP."""
    out = {}
    for name, dtype, shape, raw in _weightcast._model_tensors("moe-tiny", "target", SEED, step):
        out[name] = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)
        )
    return out


def expected_moe_worker(full, rank, tp, ep):
    """Worker `rank`'s parameters for moe-tiny at TP `tp`, EP `ep`, by torch's narrow: attention
    as the dense model's; the router whole; EP rank p = rank // (tp / ep) holds experts
    [p * 8 / ep, (p + 1) * 8 / ep), each split over its tp / ep ranks (gate/up rows, down columns),
    and nothing of the others."""
    out = {}
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        out[name] = narrowed(full, name, rank, tp)
    group, experts = tp // ep, 8
    per, part = experts // ep, rank % group
    held = range(rank // group * per, (rank // group + 1) * per)
    for i in range(spec()["num_hidden_layers"]):
        p = f"model.layers.{i}."
        attn = lambda n: narrowed(full, p + n, rank, tp)  # noqa: E731
        out[p + "self_attn.qkv_proj.weight"] = torch.cat([attn(f"self_attn.{x}_proj.weight") for x in "qkv"])
        for n in ("self_attn.o_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + n] = attn(n)
        out[p + "mlp.gate.weight"] = full[p + "mlp.gate.weight"]
        for e in held:
            x = f"{p}mlp.experts.{e}."
            rows = lambda t: t.narrow(0, part * (t.shape[0] // group), t.shape[0] // group)  # noqa: E731
            out[x + "gate_up_proj.weight"] = torch.cat(
                [rows(full[x + "gate_proj.weight"]), rows(full[x + "up_proj.weight"])]
            )
            down = full[x + "down_proj.weight"]
            out[x + "down_proj.weight"] = down.narrow(
                1, part * (down.shape[1] // group), down.shape[1] // group
            )
    return out


def received_total(url):
    """weightcast-engine's weightcast_engine_bytes_received_total (its /metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("weightcast_engine_bytes_received_total "):
                return int(line.split()[1])
    raise AssertionError(f"{url}/metrics: no weightcast_engine_bytes_received_total")


HOLE = "model.layers.0.self_attn.k_proj.weight"  # sent by stage 0
OVERLAP = "model.layers.1.mlp.down_proj.weight"  # sent by stage 1, row-parallel


class Sharded(unittest.TestCase):
    def engine(self, stack, tp, extra):
        return self.engines(stack, [(tp, extra)])[0]

    def engines(self, stack, shapes):
        """Torch engines of (tp, extra) each, started together (torch_engines.running)."""
        tps, extras = zip(*shapes)
        return stack.enter_context(torch_engines.running(tps, SEED, extras=extras))

    def test_trainer_update(self):
        """tp 2 x pp 2 trainer ranks update a TP-2 and a TP-4 torch engine that announce plans
        (Qwen3-style GQA: 2 KV heads for 4 query heads, so TP-4 ranks share heads) and a
        weightcast-engine without one, delta on, 5 steps, --verify (recomputed from each engine's
        parameters). Every worker holds the torch-narrowed slices, the draft is bit-identical,
        /generate matches the single-process reference, and each worker received its slices, not
        the model: a TP-4 worker at most a quarter of the sharded bytes plus the replicated ones."""
        sliced = ["--shard-plan", "recorded", "--delta"]
        with contextlib.ExitStack() as stack:
            tp2, tp4 = self.engines(stack, [(2, sliced), (4, sliced)])
            proc, url = native.start(ranks=1, seed=SEED)
            stack.callback(lambda: (proc.kill(), proc.wait()))
            whole = torch_engines.Engine.__new__(torch_engines.Engine)
            whole.url = url
            engines = [tp2, tp4]
            drafts = [e.params() for e in engines]
            code, out = torch_engines.train([tp2, tp4, whole], 5, SEED, ["--verify", "--delta", "on"])
            self.assertEqual(code, 0, out)
            self.assertIn("step 5/5 version 5", out)
            self.assertIn("verified yes", out)
            self.assertRegex(out, r"step 2/5 .*delta_buckets [1-9]")
            full = full_tensors(5)
            reference = reference_generate(full, PROMPT, 8)
            for engine, before in zip(engines, drafts):
                for rank, held in enumerate(engine.params()):
                    for name, t in expected_worker(full, rank, engine.tp).items():
                        self.assertTrue(
                            torch.equal(held["target"][name], t), f"TP{engine.tp} worker {rank}: {name}"
                        )
                    for name, t in before[rank]["draft"].items():
                        self.assertTrue(
                            torch.equal(held["draft"][name], t), f"draft {name} changed on {rank}"
                        )
                answer = engine.generate(PROMPT, 8)
                self.assertEqual(answer["meta_info"]["weight_version"], "5")
                self.assertEqual(answer["output_ids"], reference)
            # What each TP-4 worker received over 5 steps against what it keeps: step 1 whole,
            # steps 2-5 as deltas of it (smaller), plus the buckets' alignment padding.
            model = sum(nbytes(t) for t in full.values())
            replicated = sum(nbytes(t) for n, t in full.items() if "norm" in n)
            bound = 5 * ((model - replicated) / 4 + replicated) * 1.02
            for rank, w in enumerate(tp4.ok("/debug/info")["workers"]):
                kept = sum(nbytes(narrowed(full, n, rank, 4)) for n in full)
                print(
                    f"TP-4 worker {rank}: received {w['bytes_received']} bytes in 5 steps; keeps {kept} "
                    f"of the model's {model} (bound {bound:.0f})"
                )
                self.assertGreaterEqual(w["bytes_received"], kept)
                self.assertLessEqual(w["bytes_received"], bound)

    def test_weightcast_engine_plans(self):
        """weightcast-engine with --shard-plan tensor-parallel (4 ranks, shuffled layouts, a draft)
        beside one without a plan, from tp 2 x pp 2 trainer ranks, delta on, 5 steps, --verify.
        Each of its ranks joins its own shard class's group and receives its slices (KV heads
        shared by pairs of ranks); commit puts the full tensors together. Both engines end with
        the same weights, verified by the trainer, and the sliced engine's ranks received the
        model about once in all, not once each."""
        with contextlib.ExitStack() as stack:
            procs = []
            for extra in (["--shard-plan", "tensor-parallel"], []):
                proc, url = native.start(ranks=4 if extra else 1, seed=SEED, extra=extra)
                stack.callback(lambda p=proc: (p.kill(), p.wait()))
                engine = torch_engines.Engine.__new__(torch_engines.Engine)
                engine.url = url
                procs.append(engine)
            sliced, whole = procs
            plans = sliced.ok("/server_info")["shard_plans"]
            self.assertEqual(len(plans), 4)
            self.assertEqual(
                plans[1]["tensors"]["model.layers.0.self_attn.k_proj.weight"],
                plans[0]["tensors"]["model.layers.0.self_attn.k_proj.weight"],
            )
            code, out = torch_engines.train([sliced, whole], 5, SEED, ["--verify", "--delta", "on"])
            self.assertEqual(code, 0, out)
            self.assertIn("step 5/5 version 5", out)
            self.assertIn("verified yes", out)
            self.assertRegex(out, r"step 2/5 .*delta_buckets [1-9]")
            for runner in ("target", "draft"):
                self.assertEqual(
                    native.checksums(sliced.url, runner), native.checksums(whole.url, runner), runner
                )
            # Every byte that came in on the data plane, all ranks together (its /metrics).
            received, once = (received_total(e.url) for e in (sliced, whole))
            print(f"4 sliced ranks received {received} bytes in 5 steps; one whole rank {once}")
            self.assertGreaterEqual(received, once)
            self.assertLess(received, 1.6 * once)

    def test_moe_expert_parallel(self):
        """moe-tiny (8 experts per layer) from tp 2 x pp 2 trainer ranks to a TP-2 EP-2 torch
        engine (each rank holds 4 experts whole and nothing of the other 4) and a TP-4 EP-2 one
        (each pair of ranks holds 4 experts, split between them), both announcing recorded plans,
        delta on, 5 steps, --verify. Every worker holds the torch-narrowed parameters of exactly
        its experts, /generate matches a single process holding every expert, the draft is
        bit-identical, and each worker received no expert it does not hold: at most its plan's
        share of the model per step. A 4-rank weightcast-engine with hand-written plans at EP 2
        takes the same update, verified, its ranks receiving about one copy of the model."""
        recorded = ["--model", "moe-tiny", "--ep", "2", "--shard-plan", "recorded", "--delta"]
        with contextlib.ExitStack() as stack:
            tp2, tp4 = self.engines(stack, [(2, recorded), (4, recorded)])
            engines = [tp2, tp4]
            drafts = [e.params() for e in engines]
            # weightcast-engine's hand-written plans at TP 4 EP 2, beside them: its ranks receive
            # only their EP rank's experts, its commit puts every expert together.
            tensor_parallel = ["--ep-size", "2", "--shard-plan", "tensor-parallel"]
            proc, url = native.start(ranks=4, model="moe-tiny", seed=SEED, extra=tensor_parallel)
            stack.callback(lambda: (proc.kill(), proc.wait()))
            native_plans = torch_engines.Engine.__new__(torch_engines.Engine)
            native_plans.url = url
            extra = ["--model", "moe-tiny", "--verify", "--delta", "on"]
            code, out = torch_engines.train(engines + [native_plans], 5, SEED, extra)
            self.assertEqual(code, 0, out)
            self.assertIn("step 5/5 version 5", out)
            self.assertIn("verified yes", out)
            self.assertRegex(out, r"step 2/5 .*delta_buckets [1-9]")
            full = moe_full(5)
            from weightcast.reference.model import Parallel, TargetModel, model_spec

            single = TargetModel(model_spec("moe-tiny"), Parallel())
            single.load_weights(full.items())
            reference = single.generate(PROMPT, 8)[len(PROMPT) :]  # the new tokens, as /generate answers
            model = sum(nbytes(t) for t in full.values())
            for engine, before in zip(engines, drafts):
                plans = engine.ok("/server_info")["shard_plans"]
                for rank, held in enumerate(engine.params()):
                    want = expected_moe_worker(full, rank, engine.tp, 2)
                    self.assertEqual(sorted(held["target"]), sorted(want), f"TP{engine.tp} worker {rank}")
                    for name, t in want.items():
                        self.assertTrue(
                            torch.equal(held["target"][name], t), f"TP{engine.tp} worker {rank}: {name}"
                        )
                    for name, t in before[rank]["draft"].items():
                        self.assertTrue(
                            torch.equal(held["draft"][name], t), f"draft {name} changed on {rank}"
                        )
                    absent = [n for n, e in plans[rank]["tensors"].items() if e == "absent"]
                    self.assertEqual(len(absent), 2 * 4 * 3, f"TP{engine.tp} worker {rank}: {absent}")
                answer = engine.generate(PROMPT, 8)
                self.assertEqual(answer["meta_info"]["weight_version"], "5")
                self.assertEqual(answer["output_ids"], reference)
                for rank, w in enumerate(engine.ok("/debug/info")["workers"]):
                    keeps = sum(nbytes(t) for t in expected_moe_worker(full, rank, engine.tp, 2).values())
                    print(
                        f"TP-{engine.tp} EP-2 worker {rank}: received {w['bytes_received']} bytes in 5 "
                        f"steps; keeps {keeps} of the target's {model}"
                    )
                    self.assertGreaterEqual(w["bytes_received"], keeps)
                    self.assertLessEqual(w["bytes_received"], 5 * keeps * 1.02)
            plans = native_plans.ok("/server_info")["shard_plans"]
            for rank, plan in enumerate(plans):
                absent = [n for n, e in plan["tensors"].items() if e == "absent"]
                self.assertEqual(len(absent), 2 * 4 * 3, f"weightcast-engine rank {rank}: {absent}")
            # Its 4 ranks together: about one copy of the model per step (a TP-4 EP-2 rank keeps
            # half of its EP rank's experts), where whole tensors would be 4 copies.
            received = received_total(url)
            print(f"weightcast-engine TP-4 EP-2: its 4 ranks received {received} bytes in 5 steps")
            self.assertLess(
                received, 1.6 * sum(w["bytes_received"] for w in tp4.ok("/debug/info")["workers"])
            )

    def test_plans_are_checked_at_begin(self):
        """TP-2 engines announce their recorded plans (one per rank; the update of good plans is
        test_trainer_update's). tp 1 x pp 2 trainer ranks: each stage's tensors are checked
        against the plans before that stage sends anything. A plan with a hole in a stage-0
        tensor is refused before any bucket; one whose slice of a stage-1 tensor reaches into
        another rank's is refused before stage 1 sends. Both name the engine and the tensor; the
        update fails, and the engine keeps its version with no session open."""
        recorded = ["--shard-plan", "recorded"]
        faults = (["--shard-plan-fault", f"hole:{HOLE}"], ["--shard-plan-fault", f"overlap:{OVERLAP}"])
        with contextlib.ExitStack() as stack:
            hole, overlap = self.engines(stack, [(2, recorded + extra) for extra in faults])
            plans = overlap.ok("/server_info")["shard_plans"]
            self.assertEqual(len(plans), 2)
            self.assertEqual(plans[0]["tensors"]["model.norm.weight"], "replicated")
            # The draft (a whole replica on every worker) is in every plan, replicated.
            draft = [n for n in plans[0]["tensors"] if n.startswith("draft.")]
            self.assertIn("draft.layers.0.input_layernorm.weight", draft)
            self.assertTrue(all(p["tensors"][n] == "replicated" for p in plans for n in draft))
            self.assertEqual(plans[1]["tensors"][OVERLAP], {"dim": 1, "offset": 256, "length": 256})
            self.assertEqual(plans[0]["tensors"][OVERLAP], {"dim": 1, "offset": 0, "length": 257})

            for engine, name in ((hole, HOLE), (overlap, OVERLAP)):
                code, out = torch_engines.train([engine], 1, SEED, tp=1, pp=2)
                self.assertNotEqual(code, 0, out)
                self.assertIn(f"engine {engine.url}: shard plan refused", out)
                self.assertIn(name, out)
                info = engine.ok("/server_info")
                self.assertEqual(info["weight_version"], "default", out)
                self.assertIsNone(info["session_selector"], out)
                if name == HOLE:
                    self.assertEqual(engine.ok("/debug/info")["workers"][0]["bytes_received"], 0, out)

    def test_one_class_breaks_and_no_engine_commits(self):
        """A TP-2 engine with plans (two shard classes) and a plan-less weightcast-engine (the
        full class). The TP-2 engine fails one bucket of one class group after receiving it (the
        chain of that class breaks mid-update while the other classes go on): the update fails,
        and no engine commits: both keep version and weights. The next update forms the class
        groups again and succeeds."""
        with contextlib.ExitStack() as stack:
            tp2 = self.engine(stack, 2, ["--shard-plan", "recorded"])
            proc, url = native.start(ranks=1, seed=SEED)
            stack.callback(lambda: (proc.kill(), proc.wait()))
            whole = torch_engines.Engine.__new__(torch_engines.Engine)
            whole.url = url
            small = ["--bucket-bytes", "256K", "--delta", "off"]
            code, out = torch_engines.train([tp2, whole], 1, SEED, small, tp=1, pp=2)
            self.assertEqual(code, 0, out)
            before, sums = tp2.params(), native.checksums(url)
            tp2.ok("/debug/fail_bucket", {"sequence": 1})
            code, out = torch_engines.train([tp2, whole], 1, SEED + 1, small, tp=1, pp=2)
            self.assertNotEqual(code, 0, out)
            # Which failure the trainer names first races: the broken class chain, or another
            # stage's bucket refused once the session was aborted. Either way nothing commits.
            self.assertIn("step 1/1 FAILED version 2: sending buckets failed", out)
            self.assertEqual(tp2.ok("/server_info")["weight_version"], "1", out)
            self.assertEqual(whole.ok("/server_info")["weight_version"], "1", out)
            self.assertEqual(native.checksums(url), sums)
            for rank, held in enumerate(tp2.params()):
                for name, t in before[rank]["target"].items():
                    self.assertTrue(torch.equal(held["target"][name], t), f"worker {rank}: {name} changed")
            code, out = torch_engines.train([tp2, whole], 1, SEED, small + ["--verify"], tp=1, pp=2)
            self.assertEqual(code, 0, out)
            self.assertIn("verified yes", out)


if __name__ == "__main__":
    unittest.main()
