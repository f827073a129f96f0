"""Round trip: torch (bf16, f32, int8, non-contiguous) tensors and numpy arrays -> two engines
-> every engine's digest equals XXH3-128 of the source bytes, computed here by python-xxhash."""

import unittest

import engines

engines.require_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import weightcast  # noqa: E402


def model():
    g = torch.Generator().manual_seed(3)
    return {
        "model.bf16.weight": torch.randn(96, 130, generator=g).to(torch.bfloat16),
        "model.f32.weight": torch.randn(33, 70, generator=g),
        "model.i8.weight": torch.randint(-128, 127, (40, 81), generator=g, dtype=torch.int8),
        "model.transposed.weight": torch.randn(64, 48, generator=g).t(),  # non-contiguous
        "model.scalar": torch.tensor(2.5),
        "model.empty": torch.zeros(0, 4),
        "model.np_f32.weight": np.random.default_rng(1).random((20, 30), dtype=np.float32),
        "model.np_i64": np.arange(17, dtype=np.int64),
        "model.np_f16_strided": np.random.default_rng(2).random((16, 64)).astype(np.float16)[:, ::2],
        "model.np_bool": np.array([True, False, True]),
        "model.f16.weight": torch.randn(128, 96, generator=g, dtype=torch.float64).to(torch.float16),
    }


class RoundTrip(unittest.TestCase):
    def check(self, urls, tensors, version):
        engines.assert_hold(self, urls, tensors, version)

    def test_torch_and_numpy_reach_both_engines_bit_exact(self):
        with engines.running(2, ranks=[1, 2], layout="none") as (urls, _):
            selector = weightcast.weight_update_selector(speculative_algorithm="EAGLE", mtp_num_layers=0)
            self.assertEqual(selector, "target")
            with weightcast.DistributedUpdater(
                engines=urls, selector=selector, bucket_bytes=16 << 10, verify=True
            ) as updater:
                tensors = model()
                report = updater.update(tensors.items())
                self.assertTrue(report.ok)
                self.assertTrue(report.verified)
                self.assertEqual(report.tensors, len(tensors))
                self.assertGreater(report.buckets, 1)
                self.assertEqual(
                    list(report.phases), ["prepare", "pause", "begin", "data", "commit", "resume"]
                )
                self.assertGreater(report.phases["data"], 0)
                self.assertEqual(report.failures, [])
                self.check(urls, tensors, report.version)

                # A generator of fresh tensors (renamed on the fly): only update() holds them.
                step2 = ((name, t * 2 if isinstance(t, torch.Tensor) else t) for name, t in model().items())
                report = updater.update(step2, version="step-2")
                self.assertEqual(report.version, "step-2")
                expected = {n: (t * 2 if isinstance(t, torch.Tensor) else t) for n, t in model().items()}
                self.check(urls, expected, "step-2")
                updater.verify()

    def test_layouts_are_verified(self):
        # Shuffle layouts on both runners: verify() compares with the laid-out digests.
        with engines.running(1) as (urls, _):
            with weightcast.DistributedUpdater(engines=urls, selector="target", verify=True) as updater:
                report = updater.update(model())
                self.assertTrue(report.verified)
                self.assertIn("target", str(report))
            # A new connection per request (keep_alive=False) updates the same way.
            with weightcast.DistributedUpdater(
                engines=urls, selector="target", verify=True, keep_alive=False
            ) as updater:
                report = updater.update(
                    {n: t * 3 if isinstance(t, torch.Tensor) else t for n, t in model().items()}
                )
                self.assertTrue(report.verified)

    def test_selector_decision(self):
        f = weightcast.weight_update_selector
        self.assertEqual(f(), "all")
        self.assertEqual(f(speculative_algorithm="EAGLE", mtp_num_layers=1), "all")
        self.assertEqual(f(speculative_algorithm="EAGLE", megatron_to_hf_mode="bridge"), "all")
        self.assertEqual(f(speculative_algorithm="EAGLE3", megatron_to_hf_mode="raw"), "target")
        with self.assertRaises(weightcast.ConfigError):
            f(mtp_num_layers=-1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
