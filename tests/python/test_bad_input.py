"""Bad input and failures: each raises its documented exception, in time, and the engines keep
their previous weights (weight_version unchanged, no session left open)."""

import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import engines

engines.require_torch()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import weightcast  # noqa: E402


def unchanged(test, urls, version="default"):
    for url in urls:
        info = engines.server_info(url)
        test.assertEqual(info["weight_version"], version, url)
        test.assertIsNone(info.get("session_selector"), url)


def big_model(count=16, numel=2 << 20):
    return {f"model.big.{i}": torch.full((numel,), float(i)) for i in range(count)}


class BadInput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ctx = engines.running(1)
        cls.urls, _ = cls.ctx.__enter__()
        cls.updater = weightcast.DistributedUpdater(engines=cls.urls, selector="target")

    @classmethod
    def tearDownClass(cls):
        cls.updater.close()
        cls.ctx.__exit__(None, None, None)

    def refused(self, named_tensors, pattern):
        before = engines.server_info(self.urls[0])["weight_version"]
        with self.assertRaisesRegex(weightcast.InputError, pattern):
            self.updater.update(named_tensors)
        unchanged(self, self.urls, before)

    def test_wrong_dtype(self):
        self.refused([("model.c", torch.zeros(4, dtype=torch.complex64))], "complex64.*supported")
        self.refused([("model.u", np.zeros(4, dtype=np.uint32))], "format 'I'")

    def test_non_tensor_values(self):
        for value in ([1.0, 2.0], None, "weights", 3):
            self.refused([("model.x", value)], "expected a tensor")
        self.refused([torch.zeros(2)], "pair")
        self.refused([(7, torch.zeros(2))], "name must be a str")
        self.refused(["model.x"], "pair")
        self.refused([("bad name", torch.zeros(2))], "name")
        with self.assertRaises(TypeError):  # InputError is a TypeError too
            self.updater.update(42)

    def test_duplicate_names(self):
        t = torch.zeros(3)
        self.refused([("model.a", t), ("model.b", t), ("model.a", t)], "duplicate.*'model.a'")

    def modified_during_update(self, modify):
        before = engines.server_info(self.urls[0])["weight_version"]
        tensors = big_model()
        victim = tensors["model.big.15"]
        slow = weightcast.DistributedUpdater(
            engines=self.urls, selector="target", bucket_bytes=8 << 20, bucket_delay=0.05
        )
        done = threading.Event()

        def meddle():
            time.sleep(0.3)  # well inside the data phase (16 buckets x 50 ms)
            modify(victim)
            done.set()

        threading.Thread(target=meddle).start()
        # Caught here (the bytes changed between packing and the send check) or by the engine
        # (the bucket's bytes no longer match the digest the trainer sent with it): either way
        # named, and nothing commits.
        with slow, self.assertRaisesRegex(
            (weightcast.InputError, weightcast.EngineError), "'model.big.15'.*(during|after the broadcast)"
        ):
            slow.update(tensors.items())
        self.assertTrue(done.is_set())
        unchanged(self, self.urls, before)

    def test_tensor_modified_in_place_during_update(self):
        self.modified_during_update(lambda t: t.add_(1))

    def test_tensor_resized_during_update(self):
        self.modified_during_update(lambda t: t.resize_(16))

    def test_numpy_array_cannot_be_resized_during_update(self):
        array = np.zeros(1 << 20, dtype=np.float32)
        tensors = dict(big_model(), **{"model.np": array})
        slow = weightcast.DistributedUpdater(
            engines=self.urls, selector="target", bucket_bytes=8 << 20, bucket_delay=0.05
        )
        errors = []

        def resize():
            time.sleep(0.3)
            try:
                array.resize(16)
            except ValueError as e:
                errors.append(e)

        threading.Thread(target=resize).start()
        with slow:
            report = slow.update(tensors)
            self.assertTrue(report.ok)
        self.assertEqual(len(errors), 1)  # numpy refuses: the array is referenced


class EngineFailures(unittest.TestCase):
    def test_engine_killed_mid_update(self):
        with engines.running(2) as (urls, procs):
            updater = weightcast.DistributedUpdater(
                engines=urls,
                selector="target",
                bucket_bytes=8 << 20,
                bucket_delay=0.1,
                update_timeout=20,
                request_timeout=10,
            )
            tensors = big_model()
            with updater:
                # A first update sets up the group, so the kill lands in the second one's data
                # phase: on a busy machine a timer alone could land in the group's rendezvous,
                # which the surviving engine waits out for its whole init timeout (60 s).
                self.assertTrue(updater.update(tensors, version="warm").ok)
                threading.Timer(0.5, procs[1].kill).start()
                start = time.monotonic()
                with self.assertRaises(weightcast.EngineError) as caught:
                    updater.update(tensors)
                elapsed = time.monotonic() - start
            self.assertLess(elapsed, 25)
            self.assertEqual(caught.exception.engine, urls[1])
            self.assertFalse(caught.exception.report.ok)
            failures = caught.exception.report.failures
            self.assertIn(urls[1], [f["engine"] for f in failures])
            keys = ["engine", "route", "message", "unreachable", "timed_out"]
            for f in failures:
                self.assertEqual(list(f), keys)
            unchanged(self, urls[:1], version="warm")

    def test_ctrl_c_aborts_the_update(self):
        with engines.running(1) as (urls, _):
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, urls[0]], stdout=subprocess.PIPE, text=True, env=os.environ
            )
            self.assertEqual(child.stdout.readline().strip(), "updating")
            time.sleep(0.5)
            child.send_signal(signal.SIGINT)
            out, _ = child.communicate(timeout=30)
            self.assertEqual(child.returncode, 0, out)
            self.assertIn("KeyboardInterrupt after", out)
            # The whole update sleeps 16 s between its 32 buckets: Ctrl-C ends it at the next
            # bucket, whichever path it took (a same-host engine takes the colocated one, with no
            # communicator to abort), not after the last.
            after = float(out.split("KeyboardInterrupt after ")[1].split()[0])
            self.assertLess(after, 8.0, out)
            unchanged(self, urls)


CHILD = """
import sys, time, torch, weightcast
tensors = {f"model.big.{i}": torch.full((2 << 20,), float(i)) for i in range(32)}
with weightcast.DistributedUpdater(engines=[sys.argv[1]], selector="target",
                                   bucket_bytes=8 << 20, bucket_delay=0.5) as updater:
    print("updating", flush=True)
    start = time.monotonic()
    try:
        updater.update(tensors)
        print("not interrupted")
    except KeyboardInterrupt:
        print(f"KeyboardInterrupt after {time.monotonic() - start:.2f} s")
"""

if __name__ == "__main__":
    unittest.main(verbosity=2)
