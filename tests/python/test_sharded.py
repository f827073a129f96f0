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


HOLE = "model.layers.0.self_attn.k_proj.weight"  # sent by stage 0
OVERLAP = "model.layers.1.mlp.down_proj.weight"  # sent by stage 1, row-parallel


class Sharded(unittest.TestCase):
    def engine(self, stack, tp, extra):
        engine = torch_engines.Engine(tp, SEED, extra)
        stack.callback(engine.stop)
        return engine

    def test_trainer_update(self):
        """tp 2 x pp 2 trainer ranks update a TP-2 and a TP-4 torch engine that announce plans
        (Qwen3-style GQA: 2 KV heads for 4 query heads, so TP-4 ranks share heads) and a
        weightcast-engine without one, delta on, 5 steps, --verify (recomputed from each engine's
        parameters). Every worker holds the torch-narrowed slices, the draft is bit-identical,
        /generate matches the single-process reference, and each worker received its slices, not
        the model: a TP-4 worker at most a quarter of the sharded bytes plus the replicated ones."""
        sliced = ["--shard-plan", "recorded", "--delta"]
        with contextlib.ExitStack() as stack:
            tp2, tp4 = self.engine(stack, 2, sliced), self.engine(stack, 4, sliced)
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
            hole, overlap = (self.engine(stack, 2, recorded + extra) for extra in faults)
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
