"""Pipeline-parallel update from Python: `mpirun -np 2` of tests/python/pipeline_ranks.py, each
rank one stage's source, against two real engines (1 and 2 ranks). The ranks exchange the session
token and the stage results with torch.distributed (gloo, a file:// rendezvous in a temporary
directory: no port to pick). mpirun and its flags come from $WEIGHTCAST_MPIEXEC and
$WEIGHTCAST_MPIRUN_FLAGS (ctest sets both from the build's MPI configuration)."""

import os
import subprocess
import sys
import tempfile
import unittest

import engines

engines.require_torch()

RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_ranks.py")


class Pipeline(unittest.TestCase):
    def test_two_stage_sources_update_two_engines_atomically(self):
        with engines.running(2, ranks=[1, 2], layout="none") as (
            urls,
            _,
        ), tempfile.TemporaryDirectory() as tmp:
            env = dict(
                os.environ,
                WEIGHTCAST_URLS=",".join(urls),
                WEIGHTCAST_RENDEZVOUS="file://" + os.path.join(tmp, "rendezvous"),
            )
            argv = engines.mpirun_argv(2, ("WEIGHTCAST_URLS", "WEIGHTCAST_RENDEZVOUS"), RANKS)
            run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150)
        out = run.stdout + run.stderr
        self.assertEqual(run.returncode, 0, out)
        self.assertIn("rank 0 ok", run.stdout, out)
        self.assertIn("rank 1 ok", run.stdout, out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
