"""The shared readers of vLLM's init_info / update_info (weightcast.engine_rank), which the vLLM
plug-in's backend and the torch engine's --api vllm routes both use, on the bodies weightcast-train
writes (sync/trainer/http/vllm_client.cc: our init_weights_update_group and bucket requests inside
vLLM's dicts), and the vLLM lifecycle of one engine rank. No torch needed.
"""

import json
import unittest

from weightcast.engine_rank import EngineRank, VllmRoundAborted, parse_init_info, parse_update_info
from weightcast.receiver import Runner

# As weightcast-train writes them (vllm_init_body / vllm_update_body / vllm_abort_body).
INIT = json.loads(
    '{"init_info": {"backend": "gloo", "group_name": "weightcast-pp_0", '
    '"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, '
    '"world_size": 3, "rendezvous": {"protocol": "weightcast", "prefix": "g"}}}'
)
BUCKET = json.loads(
    '{"update_info": {"names": ["model.norm.weight"], "dtypes": ["bfloat16"], '
    '"shapes": [[8]], "group_name": "weightcast-pp_0", "selector": "target", '
    '"sequence": 3, "load_format": "weightcast_bucket", "flush_cache": true, '
    '"abort_all_requests": false, "weight_version": null, "torch_empty_cache": false, '
    '"digests": ["0123456789abcdef0123456789abcdef"]}}'
)
ABORT = {"update_info": {"abort": True, "reason": "aborted by the trainer"}}


class VllmDialect(unittest.TestCase):
    def test_init_info_is_our_group_body(self):
        body, options = parse_init_info(INIT["init_info"])
        self.assertEqual(body, INIT["init_info"])
        self.assertEqual(options, {"keep_delta_base": False})
        body, options = parse_init_info({**INIT["init_info"], "keep_delta_base": True, "rendezvous": None})
        self.assertNotIn("rendezvous", body)
        self.assertNotIn("keep_delta_base", body)
        self.assertTrue(options["keep_delta_base"])
        # A shard class's group names the engine ranks that join it (docs/sharding.md).
        body, _ = parse_init_info({**INIT["init_info"], "ranks": [1]})
        self.assertEqual(body["ranks"], [1])

    def test_init_info_errors_name_the_field(self):
        info = INIT["init_info"]
        cases = [
            ([1], "init_info: must be a JSON object"),
            ({**info, "selector": "all"}, "unknown field(s) selector"),
            ({k: v for k, v in info.items() if k != "master_address"}, "init_info.master_address"),
            ({**info, "master_port": "29500"}, "init_info.master_port: must be an integer"),
            ({**info, "world_size": True}, "init_info.world_size: must be an integer"),
        ]
        for value, message in cases:
            with self.assertRaises(ValueError, msg=value) as caught:
                parse_init_info(value)
            self.assertIn(message, str(caught.exception))

    def test_update_info_is_our_bucket_request(self):
        kind, body = parse_update_info({**BUCKET["update_info"], "session_id": "vllm"})
        self.assertEqual(kind, "bucket")
        self.assertEqual(body, BUCKET["update_info"])  # session_id dropped, the rest unchanged
        self.assertEqual(parse_update_info(ABORT["update_info"]), ("abort", "aborted by the trainer"))
        self.assertEqual(parse_update_info({"abort": True}), ("abort", "aborted"))

    def test_update_info_errors_name_the_field(self):
        info = BUCKET["update_info"]
        cases = [
            ("bucket", "update_info: must be a JSON object"),
            ({k: v for k, v in info.items() if k != "names"}, "update_info.names: required"),
            ({**info, "shapes": [[8], [2]]}, "one entry per tensor"),
            ({**info, "abort": "yes"}, None),  # only abort: true aborts; this is a bucket
        ]
        for value, message in cases:
            if message is None:
                self.assertEqual(parse_update_info(value)[0], "bucket")
                continue
            with self.assertRaises(ValueError) as caught:
                parse_update_info(value)
            self.assertIn(message, str(caught.exception))

    def test_rank_lifecycle_refuses_buckets_outside_an_update(self):
        """As vLLM's worker needs it: an abort raises (the worker leaves its update only when the
        backend raises), a bucket or a finish outside a round is refused, a bucket for the other
        model is refused naming the route, and an empty round still commits its version."""
        rank = EngineRank(runners=[Runner("target", lambda pairs: None)], engine_rank=0, rank_count=1)
        with self.assertRaisesRegex(RuntimeError, "without start_weight_update"):
            rank.vllm_update(BUCKET["update_info"])
        with self.assertRaisesRegex(VllmRoundAborted, "round aborted"):
            rank.vllm_update(ABORT["update_info"])
        rank.vllm_start()
        with self.assertRaisesRegex(VllmRoundAborted, "no weights changed"):
            rank.vllm_update(ABORT["update_info"])  # the trainer's abort ends the round
        with self.assertRaisesRegex(RuntimeError, "after an abort"):
            rank.vllm_update(BUCKET["update_info"])
        with self.assertRaisesRegex(RuntimeError, "finish_weight_update without"):
            rank.vllm_finish("6")
        self.assertFalse(rank.receiver.in_session)
        rank.vllm_start("draft")
        with self.assertRaisesRegex(ValueError, "/start_weight_update"):
            rank.vllm_update({**BUCKET["update_info"], "selector": "target"})
        self.assertFalse(rank.receiver.in_session)
        rank.vllm_start()
        result = rank.vllm_finish("7")  # an update of no bucket still commits its version
        self.assertEqual(result["weight_version"], "7")
        self.assertEqual(rank.receiver.weight_version, "7")


if __name__ == "__main__":
    unittest.main(verbosity=2)
