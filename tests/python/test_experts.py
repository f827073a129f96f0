"""Expert-parallel updates from Python: `mpirun` of tests/python/experts_ranks.py, each rank an
expert-parallel rank holding only its own experts, against a real engine. EP 2 on one stage
(2 processes), and EP 2 on each of two pipeline stages (4 processes). The ranks talk over
torch.distributed (gloo, a file:// rendezvous in a temporary directory: no port to pick). mpirun
and its flags come from $WEIGHTCAST_MPIEXEC and $WEIGHTCAST_MPIRUN_FLAGS (ctest sets both)."""

import os
import subprocess
import sys
import tempfile
import unittest

import engines

engines.require_torch()

RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "experts_ranks.py")


class Experts(unittest.TestCase):
    def run_ranks(self, layout, np, engine_ranks):
        with engines.running(len(engine_ranks), ranks=engine_ranks, layout="none", model="moe-tiny") as (
            urls,
            _,
        ), tempfile.TemporaryDirectory() as tmp:
            env = dict(
                os.environ,
                WEIGHTCAST_URLS=",".join(urls),
                WEIGHTCAST_LAYOUT=layout,
                WEIGHTCAST_RENDEZVOUS="file://" + os.path.join(tmp, "rendezvous"),
            )
            argv = engines.mpirun_argv(
                np, ("WEIGHTCAST_URLS", "WEIGHTCAST_LAYOUT", "WEIGHTCAST_RENDEZVOUS"), RANKS
            )
            run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
        out = run.stdout + run.stderr
        self.assertEqual(run.returncode, 0, out)
        for r in range(np):
            self.assertIn(f"rank {r} ok", run.stdout, out)

    def test_auto_gather_overlaps_only_across_hosts(self):
        """gather="auto": whole when every EP rank shares the source's host, overlap otherwise."""
        from weightcast.experts import _pick_gather

        self.assertEqual(_pick_gather("auto", "a", ["a", "a", "a"]), "whole")
        self.assertEqual(_pick_gather("auto", "a", ["a", "b"]), "overlap")
        self.assertEqual(_pick_gather("whole", "a", ["a", "b"]), "whole")
        self.assertEqual(_pick_gather("overlap", "a", ["a"]), "overlap")

    def test_two_ep_ranks_update_one_engine_bit_for_bit(self):
        self.run_ranks("ep", 2, [2])

    def test_two_stages_of_two_ep_ranks(self):
        self.run_ranks("pp-ep", 4, [1])

    def test_send_stage_reads_a_tensor_only_after_await_tensor(self):
        """send_stage(await_tensor=f), in one process: every tensor starts zeroed and f(name)
        writes its bytes in place, so a read before f returned would send zeros (and
        verification would fail); f is called exactly once per tensor, though the sender's
        hasher and packer threads both read every tensor."""
        import collections
        import threading

        import torch

        import weightcast

        with engines.running(1, ranks=[1], layout="none", model="moe-tiny") as (urls, _):
            body = engines.checksums(urls[0])[0]
            info = json_tensors(urls[0])
            g = torch.Generator().manual_seed(3)
            real = {n: torch.randn(*shape, generator=g).to(getattr(torch, dtype)) for n, dtype, shape in info}
            given = {n: torch.zeros_like(t) for n, t in real.items()}
            calls = collections.Counter()
            lock = threading.Lock()

            def arrive(name):
                with lock:
                    calls[name] += 1
                given[name].copy_(real[name])  # in place: its version counter moves

            with weightcast.DistributedUpdater(
                engines=urls, selector="target", verify=True, bucket_bytes=64 << 10
            ) as updater:
                token = updater.open_session(version="await-1")
                result = updater.send_stage(token, 0, given.items(), await_tensor=arrive)
                self.assertTrue(result.ok, result.error)
                report = updater.finish(token, [result])
                self.assertTrue(report.ok and report.verified, report)
                self.assertEqual(calls, collections.Counter(real.keys()))  # once per tensor
                held, version = engines.checksums(urls[0])
                self.assertEqual(version, "await-1")
                for name, t in real.items():
                    self.assertEqual(held[name], digest(t), name)
                self.assertEqual(len(body), len(real))

                # An await_tensor that raises fails the stage; finish() aborts the session.
                def refuse(name):
                    raise RuntimeError("not here yet")

                token = updater.open_session(version="await-2")
                result = updater.send_stage(token, 0, given.items(), await_tensor=refuse)
                self.assertFalse(result.ok)
                self.assertIn("not here yet", result.error)
                with self.assertRaises(weightcast.Error):
                    updater.finish(token, [result])
                self.assertEqual(engines.checksums(urls[0])[1], "await-1")


def json_tensors(url):
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/weights_checksum?runner=target", timeout=30) as r:
        return [(t["name"], t["dtype"], t["shape"]) for t in json.load(r)["tensors"]]


def digest(tensor):
    import xxhash

    return xxhash.xxh3_128(engines.source_bytes(tensor)).hexdigest()


if __name__ == "__main__":
    unittest.main(verbosity=2)
