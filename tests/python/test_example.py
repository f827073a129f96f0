"""examples/python/update_from_torch.py against two engines (1 and 2 ranks): three real optimizer
steps, each followed by a verified update."""

import os
import subprocess
import sys
import unittest

import engines

engines.require_torch()

EXAMPLE = os.environ.get("WEIGHTCAST_EXAMPLE") or os.path.join(
    os.path.dirname(__file__), "..", "..", "examples", "python", "update_from_torch.py"
)


class Example(unittest.TestCase):
    def test_example_updates_two_engines_each_step(self):
        with engines.running(2, ranks=[1, 2], layout="none") as (urls, _):
            run = subprocess.run(
                [sys.executable, EXAMPLE, *urls], capture_output=True, text=True, timeout=120
            )
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        lines = run.stdout.splitlines()
        self.assertEqual(lines[0], "selector target")
        for step in (1, 2, 3):
            line = lines[step]
            self.assertTrue(line.startswith(f"step {step} loss "), line)
            self.assertIn(f"version {step} selector target tensors 6", line)
            self.assertTrue(line.endswith(" verified"), line)


if __name__ == "__main__":
    unittest.main(verbosity=2)
