"""The colocated path from Python: DistributedUpdater(colocate=...) sends to same-host engines
through shared memory (docs/colocated.md) and to the others on the chain, in one update; every
engine's digests equal XXH3-128 of the source bytes."""

import os
import unittest

import engines

engines.require_torch()

import torch  # noqa: E402

import weightcast  # noqa: E402


def model(scale=1.0):
    g = torch.Generator().manual_seed(7)
    return {
        "model.bf16.weight": (torch.randn(96, 130, generator=g) * scale).to(torch.bfloat16),
        "model.f32.weight": torch.randn(33, 70, generator=g) * scale,
        "model.transposed.weight": (torch.randn(64, 48, generator=g) * scale).t(),  # non-contiguous
        "model.scalar": torch.tensor(2.5 * scale),
    }


def shm_names():
    return sorted(os.listdir("/dev/shm"))


class Colocate(unittest.TestCase):
    def check(self, urls, tensors, version):
        engines.assert_hold(self, urls, tensors, version)

    def test_colocated_updates_are_bit_exact_and_leave_nothing_in_dev_shm(self):
        before = shm_names()
        with engines.running(2, ranks=[1, 2], layout="none") as (urls, _):
            with weightcast.DistributedUpdater(
                engines=urls, selector="target", bucket_bytes=16 << 10, verify=True, colocate="on"
            ) as updater:
                for step in (1, 2):
                    tensors = model(scale=step)
                    report = updater.update(tensors.items())
                    self.assertTrue(report.ok, report.error)
                    self.assertTrue(report.verified)
                    self.assertEqual(report.data_path, "colocated")
                    self.assertGreater(report.buckets, 1)
                    self.check(urls, tensors, report.version)
        self.assertEqual(shm_names(), before)

    def test_off_keeps_every_engine_on_the_chain(self):
        with engines.running(1, layout="none") as (urls, _):
            with weightcast.DistributedUpdater(engines=urls, selector="target", colocate="off") as updater:
                report = updater.update(model().items())
                self.assertTrue(report.ok, report.error)
                self.assertNotIn("colocated", report.data_path)

    def test_bad_mode_is_a_config_error(self):
        with self.assertRaisesRegex(weightcast.ConfigError, "unknown colocate mode"):
            weightcast.DistributedUpdater(engines=["http://127.0.0.1:1"], colocate="yes")


if __name__ == "__main__":
    unittest.main()
