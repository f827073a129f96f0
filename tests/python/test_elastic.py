"""The elastic engine set from Python (on_engine_failure="drop"): an engine killed between two
updates is dropped, the update completes on the other, and the report names the dropped one; under
the default ("fail") the same kill fails the update (EngineError naming the engine and route)."""

import unittest

import engines

engines.require_torch()

import torch  # noqa: E402

import weightcast  # noqa: E402


def model(step):
    g = torch.Generator().manual_seed(step)
    return {f"model.layers.{i}.weight": torch.randn(64, 96, generator=g).to(torch.bfloat16) for i in range(4)}


class Elastic(unittest.TestCase):
    def run_with(self, policy):
        with engines.running(2) as (urls, procs):
            with weightcast.DistributedUpdater(
                engines=urls,
                selector="target",
                on_engine_failure=policy,
                probe_timeout=0.5,
                request_timeout=5.0,
                group_timeout=10.0,
                update_timeout=10.0,
            ) as updater:
                first = updater.update(model(1))
                self.assertTrue(first.ok, first.error)
                procs[1].kill()
                procs[1].wait()
                second = updater.update(model(2))
                _, held_version = engines.checksums(urls[0], "target")
                return urls, second, held_version

    def test_drop_completes_on_the_survivor_and_names_the_dropped_engine(self):
        urls, report, held = self.run_with("drop")
        self.assertTrue(report.ok, report.error)
        self.assertEqual(held, report.version)
        self.assertEqual([url for url, _ in report.dropped], [urls[1]])
        self.assertEqual(report.engines_current, 1)

    def test_fail_fails_the_update_naming_the_engine(self):
        with self.assertRaises(weightcast.EngineError) as raised:
            self.run_with("fail")
        self.assertIn("pause_generation", str(raised.exception))

    def test_bad_policy_is_a_config_error(self):
        with self.assertRaises(weightcast.ConfigError):
            weightcast.DistributedUpdater(engines=["http://127.0.0.1:1"], on_engine_failure="skip")


if __name__ == "__main__":
    unittest.main()
