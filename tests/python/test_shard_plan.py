"""A plan recorded from the torch reference model's own load_weights (weightcast.shard_plan)
equals the hand-written C++ rules for every tensor, at TP 1, 2 and 4 (4 ranks over 2 KV heads:
each KV head kept by a pair of ranks), and passes the C++ checks; a plan with a hole is refused
naming the tensor."""

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
        preset = "tiny"
        spec, tensors = model_spec(preset), self.tensors(preset)
        for tp in (1, 2, 4):
            plans = []
            for rank in range(tp):
                model = TargetModel(spec, Parallel(rank, tp))
                recorded = shard_plan.record_plan(model, tensors)
                written = shard_plan.hand_written_plan(spec, "target", tp, rank)
                self.assertEqual(sorted(recorded["tensors"]), sorted(written["tensors"]))
                for name, entry in written["tensors"].items():
                    self.assertEqual(recorded["tensors"][name], entry, f"tp {tp} rank {rank} {name}")
                plans.append(recorded)
            shard_plan.validate_plans(spec, "target", plans)

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


if __name__ == "__main__":
    unittest.main()
