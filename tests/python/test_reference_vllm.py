"""The reference engine's --api vllm routes follow vLLM's worker state machine (the weight-update
part of vllm/v1/worker/gpu_worker.py, upstream main), as weightcast's backend meets it inside
vLLM, so the reference engine can no longer be kinder than vLLM (tests/upstream/vllm/ checks the
plug-in itself against stand-ins of each vLLM version):
  - finish or update without a start, and a start while an update is active, are refused (500,
    with vLLM's messages);
  - the trainer's abort ({"abort": true}) raises, and that ends the update (vLLM's worker leaves
    it only when the backend raises): the next start is accepted;
  - an update of no bucket still commits the version finish names.
Real processes: python -m weightcast.reference --tp 1 --api vllm.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import torch_engines  # noqa: E402

torch_engines.require_torch()


class TorchEngineVllm(unittest.TestCase):
    def refused(self, engine, route, body, needle):
        status, answer = engine.call(route, body)
        self.assertEqual(status, 500, f"{route}: {answer}")
        self.assertIn(needle, answer["detail"])

    def test_worker_state_machine(self):
        with torch_engines.running([1], 7, ["--api", "vllm"]) as (e,):
            self.refused(
                e,
                "/finish_weight_update",
                {},
                "finish_weight_update called without a matching start_weight_update",
            )
            self.refused(
                e,
                "/update_weights",
                {"update_info": {"abort": True}},
                "start_weight_update must be called before update_weights",
            )
            e.ok("/start_weight_update", {})
            self.refused(e, "/start_weight_update", {}, "called while a weight update is already active")
            self.refused(
                e, "/start_draft_weight_update", {}, "called while a weight update is already active"
            )
            self.refused(
                e,
                "/update_weights",
                {"update_info": {"abort": True, "reason": "probe"}},
                "round aborted (probe)",
            )
            e.ok("/start_draft_weight_update", {})  # the abort ended the update: not locked
            e.ok("/finish_weight_update", {"weight_version": "7"})
            status, answer = e.call("/weight_info")
            self.assertEqual((status, answer["weight_version"]), (200, "7"))
            self.refused(e, "/finish_weight_update", {}, "without a matching start_weight_update")


if __name__ == "__main__":
    unittest.main(verbosity=2)
