"""Expert-parallel updates from Python: `mpirun` of tests/python/experts_ranks.py, each rank an
expert-parallel rank holding only its own experts, against a real engine. EP 2 on one stage
(2 processes), and EP 2 on each of two pipeline stages (4 processes). The ranks talk over
torch.distributed (gloo, a file:// rendezvous in a temporary directory: no port to pick). mpirun
and its flags come from $WEIGHTCAST_MPIEXEC and $WEIGHTCAST_MPIRUN_FLAGS (ctest sets both)."""

import os
import shlex
import subprocess
import sys
import tempfile
import unittest

import engines

engines.require_torch()

RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "experts_ranks.py")


def mpirun():
    exe = os.environ.get("WEIGHTCAST_MPIEXEC") or "mpirun"
    return [exe, *shlex.split(os.environ.get("WEIGHTCAST_MPIRUN_FLAGS", ""))]


class Experts(unittest.TestCase):
    def run_ranks(self, layout, np, engine_ranks):
        with engines.running(len(engine_ranks), ranks=engine_ranks, layout="none",
                             model="moe-tiny") as (urls, _), \
                tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, WEIGHTCAST_URLS=",".join(urls), WEIGHTCAST_LAYOUT=layout,
                       WEIGHTCAST_RENDEZVOUS="file://" + os.path.join(tmp, "rendezvous"))
            argv = [*mpirun(), "-np", str(np), "-x", "PYTHONPATH", "-x", "WEIGHTCAST_URLS",
                    "-x", "WEIGHTCAST_LAYOUT", "-x", "WEIGHTCAST_RENDEZVOUS", sys.executable, RANKS]
            run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
        out = run.stdout + run.stderr
        self.assertEqual(run.returncode, 0, out)
        for r in range(np):
            self.assertIn(f"rank {r} ok", run.stdout, out)

    def test_two_ep_ranks_update_one_engine_bit_for_bit(self):
        self.run_ranks("ep", 2, [2])

    def test_two_stages_of_two_ep_ranks(self):
        self.run_ranks("pp-ep", 4, [1])


if __name__ == "__main__":
    unittest.main(verbosity=2)
