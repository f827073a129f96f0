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


def shm_names(expected=None, wait=10.0):
    """/dev/shm's names; with `expected`, waits up to `wait` s for them (torch's shm manager, which
    the file_system sharing strategy starts, unlinks a sender's files after it has gone)."""
    import time

    deadline = time.monotonic() + wait
    while expected is not None and sorted(os.listdir("/dev/shm")) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
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

    def test_true_and_false_mean_on_and_off(self):
        with engines.running(1, layout="none") as (urls, _):
            with weightcast.DistributedUpdater(engines=urls, selector="target", colocate=True) as updater:
                report = updater.update(model().items())
                self.assertTrue(report.ok, report.error)
                self.assertEqual(report.data_path, "colocated")
            with weightcast.DistributedUpdater(engines=urls, selector="target", colocate=False) as updater:
                report = updater.update(model(scale=2).items())
                self.assertTrue(report.ok, report.error)
                self.assertNotIn("colocated", report.data_path)

    def test_bad_mode_is_a_config_error(self):
        with self.assertRaisesRegex(weightcast.ConfigError, "unknown colocate mode"):
            weightcast.DistributedUpdater(engines=["http://127.0.0.1:1"], colocate="yes")
        with self.assertRaisesRegex(weightcast.ConfigError, "unknown colocate memory"):
            weightcast.DistributedUpdater(engines=["http://127.0.0.1:1"], colocate_memory="gpu")

    def test_cuda_memory_without_a_device_fails_before_any_bucket(self):
        """colocate_memory="cuda" (docs/colocated.md, "On GPUs") where no CUDA device is: the
        update raises a ConfigError naming the cause and the engine keeps its version. (The device
        case is NcclColocateCudaE2E, run by scripts/gpu-check.sh.)"""
        from weightcast import _weightcast

        if _weightcast._cuda_device_count() > 0:
            self.skipTest("a CUDA device is here: the device case runs in scripts/gpu-check.sh")
        with engines.running(1, layout="none") as (urls, _):
            before = engines.server_info(urls[0])["weight_version"]
            with weightcast.DistributedUpdater(
                engines=urls, selector="target", colocate="on", colocate_memory="cuda"
            ) as updater:
                with self.assertRaisesRegex(weightcast.ConfigError, "colocate memory cuda: no CUDA device"):
                    updater.update(model().items())
            self.assertEqual(engines.server_info(urls[0])["weight_version"], before)

    def test_miles_sender_drives_weightcast_engine(self):
        """The Miles-style sender (miles_sender.py, a process of its own) against weightcast-engine:
        the pickled form is a 400 that says what to send, and nothing changes; weightcast's segment
        form of the same flattened buckets updates a 2-rank engine for 2 steps, bit-exact."""
        import subprocess
        import sys
        import tempfile

        from weightcast import _weightcast

        def send(url, steps, extra):
            sender = os.path.join(os.path.dirname(__file__), "miles_sender.py")
            argv = [sys.executable, sender, "--engine", url, "--steps", steps, *extra]
            with tempfile.TemporaryFile("w+") as out:  # a file: torch's shm daemon keeps a pipe open
                code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=120).returncode
                out.seek(0)
                return code, out.read()

        def step_tensors(k):
            out = {}
            for name, dtype, shape, raw in _weightcast._model_tensors("tiny", "target", 7, k):
                out[name] = (
                    torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                    .view(getattr(torch, dtype))
                    .view(shape)
                )
            return out

        before = shm_names()
        with engines.running(1, ranks=[2], layout="none") as ((url,), _):
            held = engines.checksums(url)
            code, out = send(url, "1", ["--tp-size", "2", "--expect", "400"])
            self.assertEqual(code, 0, out)
            self.assertIn("not read by weightcast-engine", out)
            self.assertIn("weightcast_segment", out)
            self.assertEqual(engines.checksums(url), held)
            code, out = send(url, "1:2", ["--tp-size", "2", "--form", "segment", "--fetches", "1"])
            self.assertEqual(code, 0, out)
            self.assertEqual(out.count('"route": "end", "status": 200'), 2, out)
            self.check([url], step_tensors(2), "2")
        self.assertEqual(shm_names(before), before)


if __name__ == "__main__":
    unittest.main()
