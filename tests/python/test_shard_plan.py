"""A plan recorded from the torch reference model's own load_weights (weightcast.shard_plan)
equals the hand-written C++ rules for every tensor, at TP 1, 2 and 4 (4 ranks over 2 KV heads:
each KV head kept by a pair of ranks), and for the MoE model at EP 1, 2 and 4 (experts absent from
the ranks of other EP ranks, or split over the TP ranks of their own), and passes the C++ checks;
a plan with a hole is refused
naming the tensor. Loading only a rank's slices (shard_plan.sliced_pairs) gives the parameters that
loading the full tensors gives, bit for bit; a use of a slice that would read bytes outside it
raises, naming the tensor."""

import sys
import unittest

try:
    import torch
except ImportError as e:
    print(f"skipped: this interpreter cannot import torch ({e})")
    sys.exit(77)

from weightcast import _weightcast, shard_plan
from weightcast.reference.model import Parallel, TargetModel, model_spec

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class RecordedPlan(unittest.TestCase):
    def tensors(self, preset):
        out = []
        for entry in _weightcast._model_tensors(preset, "target", 1):
            name, dtype, shape = entry[0], entry[1], entry[2]
            out.append((name, tuple(shape), DTYPES[dtype]))
        return out

    def test_recorded_equals_hand_written(self):
        cases = [("tiny", tp, 1) for tp in (1, 2, 4)]
        cases += [("moe-tiny", tp, ep) for tp, ep in ((2, 1), (2, 2), (4, 2), (4, 4))]
        for preset, tp, ep in cases:
            spec, tensors = model_spec(preset), self.tensors(preset)
            plans = []
            for rank in range(tp):
                model = TargetModel(spec, Parallel(rank, tp, ep))
                recorded = shard_plan.record_plan(model, tensors)
                written = shard_plan.hand_written_plan(spec, "target", tp, rank, ep)
                self.assertEqual(sorted(recorded["tensors"]), sorted(written["tensors"]))
                for name, entry in written["tensors"].items():
                    where = f"{preset} tp {tp} ep {ep} rank {rank} {name}"
                    self.assertEqual(recorded["tensors"][name], entry, where)
                plans.append(recorded)
            shard_plan.validate_plans(spec, "target", plans)
            if ep > 1:  # rank 0 holds expert 0 and not the last one
                last = f"model.layers.0.mlp.experts.{spec['num_experts'] - 1}.up_proj.weight"
                self.assertEqual(plans[0]["tensors"][last], "absent", preset)
                self.assertNotEqual(
                    plans[0]["tensors"]["model.layers.0.mlp.experts.0.up_proj.weight"], "absent"
                )

    def test_tensor_shapes_from_an_hf_config(self):
        """The full shapes an engine's HF config implies (the SGLang plug-in checks adapters
        against them) are the shapes of the model's own tensors."""
        spec = model_spec("tiny")
        want = {name: list(shape) for name, shape, _ in self.tensors("tiny")}
        self.assertEqual(shard_plan.tensor_shapes(spec), want)
        hf = dict(spec, architectures=["Qwen3ForCausalLM"], rope_theta=1e6)  # keys it does not use
        self.assertEqual(shard_plan.tensor_shapes(hf)["model.layers.0.self_attn.k_proj.weight"], [128, 256])
        with self.assertRaises(Exception):
            shard_plan.tensor_shapes({"hidden_size": 8})

    def test_a_plan_with_a_hole_is_refused_naming_the_tensor(self):
        spec = model_spec("tiny")
        plans = [shard_plan.hand_written_plan(spec, "target", 2, r) for r in range(2)]
        name = "model.layers.1.mlp.down_proj.weight"
        plans[1]["tensors"][name] = "absent"
        with self.assertRaises(Exception) as cm:
            shard_plan.validate_plans(spec, "target", plans)
        self.assertIn(f"tensor '{name}'", str(cm.exception))

    def test_loading_slices_equals_loading_full_tensors(self):
        """Every rank at TP 1, 2 and 4 (4 ranks over 2 KV heads: pairs of ranks share a head)
        loads its slices, each alone in memory (a copy), into the same parameters as the full
        tensors."""
        preset = "tiny"
        spec, tensors = model_spec(preset), self.tensors(preset)
        gen = torch.Generator().manual_seed(7)
        full = {name: torch.randn(shape, generator=gen).to(dtype) for name, shape, dtype in tensors}
        shapes = {name: list(shape) for name, shape, _ in tensors}
        for tp in (1, 2, 4):
            for rank in range(tp):
                plan = shard_plan.hand_written_plan(spec, "target", tp, rank)
                slices = []
                for name, t in full.items():
                    entry = plan["tensors"][name]
                    if entry != "replicated":
                        t = t.narrow(entry["dim"], entry["offset"], entry["length"]).clone()
                    slices.append((name, t))
                want, got = TargetModel(spec, Parallel(rank, tp)), TargetModel(spec, Parallel(rank, tp))
                want.load_weights(iter(full.items()))
                loaded = got.load_weights(shard_plan.sliced_pairs(slices, plan, shapes))
                self.assertEqual(sorted(loaded), sorted(full))
                params = dict(got.named_parameters())
                for pname, p in want.named_parameters():
                    self.assertTrue(
                        torch.equal(p.view(torch.int16), params[pname].view(torch.int16)),
                        f"tp {tp} rank {rank} {pname}",
                    )

    def test_reading_outside_a_slice_raises_naming_the_tensor(self):
        name = "model.layers.0.self_attn.q_proj.weight"
        full = torch.randn(256, 256).to(torch.bfloat16)
        entry = {"dim": 0, "offset": 128, "length": 128}  # rank 1 of TP 2
        t = shard_plan.as_full(full.narrow(0, 128, 128).clone(), [256, 256], entry, name=name)
        self.assertEqual(
            (t.shape, t.size(), t.size(0), t.dim(), t.dtype), ((256, 256), (256, 256), 256, 2, torch.bfloat16)
        )
        inside = t.narrow(0, 192, 64)
        self.assertIs(type(inside), torch.Tensor)
        self.assertTrue(torch.equal(inside, full[192:]))
        self.assertTrue(torch.equal(torch.narrow(t, 0, 128, 128).narrow(0, 8, 8), full[136:144]))
        # A narrow that covers the slice and more stands in for that range; its narrows compose.
        self.assertTrue(torch.equal(t.narrow(0, 64, 192).narrow(0, 64, 128), full[128:]))
        uses = {
            "narrow outside": lambda: t.narrow(0, 0, 128),
            "narrow across its edge, then read": lambda: t.narrow(0, 64, 128).clone(),
            "narrow along another dim": lambda: t.narrow(1, 0, 128),
            "copy_ of the whole": lambda: torch.empty(256, 256, dtype=torch.bfloat16).copy_(t),
            "view": lambda: t.view(-1),
            "reshape": lambda: t.reshape(2, 128, 256),
            "index": lambda: t[200],
            "data": lambda: t.data,
        }
        for what, use in uses.items():
            with self.subTest(what), self.assertRaises(ValueError) as cm:
                use()
            self.assertIn(f"tensor '{name}'", str(cm.exception))
        plan = {"tensors": {name: "absent"}}
        for pairs in ([(name, full.narrow(0, 0, 128))], [("model.norm.weight", full)]):
            with self.assertRaises(ValueError) as cm:
                list(shard_plan.sliced_pairs(pairs, plan, {name: [256, 256]}))
            self.assertIn(f"tensor '{pairs[0][0]}'", str(cm.exception))
        # A tensor that arrives whole (a trainer that does not shard) passes as it is.
        ((_, whole),) = shard_plan.sliced_pairs([(name, full)], plan, {name: [256, 256]})
        self.assertIs(whole, full)


if __name__ == "__main__":
    unittest.main()
