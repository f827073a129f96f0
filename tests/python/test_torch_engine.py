"""The torch reference engine updated by weightcast-train, checked with torch alone.

Real processes: torch engines at TP 2 and TP 1 (python -m weightcast.reference, each worker
receiving through weightcast.Receiver) and `mpirun -np 4 weightcast-train --tp 2 --pp 2`.
Expectations are computed here, independently of weightcast's digests: the trainer's weights at
step k are the generator's (weightcast._weightcast._model_tensors, --drift jump), each worker
must hold exactly their TP slices (narrowed here with torch), and /generate must match a
single-process forward written here over the full tensors.
Run one case: test_torch_engine.py TorchEngine.test_trainer_update
"""

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import torch_engines  # noqa: E402

torch_engines.require_torch()
import torch  # noqa: E402

from weightcast import _weightcast  # noqa: E402

SEED = 7
PROMPT = [3, 14, 15, 92, 65]


def full_tensors(step, runner="target"):
    out = {}
    for name, dtype, shape, raw in _weightcast._model_tensors("tiny", runner, SEED, step):
        out[name] = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)
        )
    return out


def spec():
    import json

    return json.loads(_weightcast._model_spec("tiny"))


def shard(full, dim, rank, tp):
    size = full.shape[dim] // tp
    return full.narrow(dim, rank * size, size)


def expected_worker(full, rank, tp):
    """What worker `rank` of a TP-`tp` engine must hold, fused as its parameters are."""
    s = spec()
    out = {
        "model.embed_tokens.weight": shard(full["model.embed_tokens.weight"], 0, rank, tp),
        "model.norm.weight": full["model.norm.weight"],
        "lm_head.weight": shard(full["lm_head.weight"], 0, rank, tp),
    }
    for i in range(s["num_hidden_layers"]):
        p = f"model.layers.{i}."
        f = lambda n: full[p + n]  # noqa: E731
        out[p + "self_attn.qkv_proj.weight"] = torch.cat(
            [shard(f(f"self_attn.{x}_proj.weight"), 0, rank, tp) for x in "qkv"]
        )
        out[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [shard(f(f"mlp.{x}_proj.weight"), 0, rank, tp) for x in ("gate", "up")]
        )
        out[p + "self_attn.o_proj.weight"] = shard(f("self_attn.o_proj.weight"), 1, rank, tp)
        out[p + "mlp.down_proj.weight"] = shard(f("mlp.down_proj.weight"), 1, rank, tp)
        out[p + "input_layernorm.weight"] = f("input_layernorm.weight")
        out[p + "post_attention_layernorm.weight"] = f("post_attention_layernorm.weight")
    return out


def reference_generate(full, ids, n):
    """Greedy decoding with one process and the full, unfused tensors (float64)."""
    s, d = spec(), torch.float64
    w = {k: v.to(d) for k, v in full.items()}
    hd, heads, kvh = s["head_dim"], s["num_attention_heads"], s["num_key_value_heads"]

    def norm(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g

    def rope(x, pos):
        half = hd // 2
        inv = 1.0 / (10000.0 ** (torch.arange(0, half, dtype=d) * 2 / hd))
        ang = pos[:, None] * inv[None, :]
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    ids = list(ids)
    for _ in range(n):
        t = len(ids)
        pos = torch.arange(t, dtype=d)
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        for i in range(s["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = norm(x, w[p + "input_layernorm.weight"])
            q = rope((h @ w[p + "self_attn.q_proj.weight"].t()).view(t, heads, hd), pos)
            k = rope((h @ w[p + "self_attn.k_proj.weight"].t()).view(t, kvh, hd), pos)
            v = (h @ w[p + "self_attn.v_proj.weight"].t()).view(t, kvh, hd)
            k, v = k.repeat_interleave(heads // kvh, 1), v.repeat_interleave(heads // kvh, 1)
            att = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
            o = torch.einsum("hqk,khd->qhd", att, v).reshape(t, heads * hd)
            x = x + o @ w[p + "self_attn.o_proj.weight"].t()
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            g, u = h @ w[p + "mlp.gate_proj.weight"].t(), h @ w[p + "mlp.up_proj.weight"].t()
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].t()
        logits = norm(x, w["model.norm.weight"])[-1] @ w["lm_head.weight"].t()
        ids.append(int(logits.argmax()))
    return ids[-n:]


def raw(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy()


def accept_length(full_target, draft_fc):
    s = spec()
    return _weightcast._spec_accept_length(
        "bfloat16",
        s["vocab_size"],
        s["hidden_size"],
        raw(full_target["model.embed_tokens.weight"]),
        raw(full_target["lm_head.weight"]),
        raw(draft_fc),
    )


def miles_send(engine, steps, extra):
    """Runs the Miles-style sender against `engine`: (exit code, its output)."""
    sender = os.path.join(os.path.dirname(__file__), "miles_sender.py")
    argv = [sys.executable, sender, "--engine", engine.url, "--seed", str(SEED), "--steps", steps, *extra]
    # Output to a file, not a pipe: torch's shared-memory manager (the file_system strategy), a
    # daemon the sender starts, keeps its inherited descriptors until its last client is gone.
    with tempfile.TemporaryFile("w+") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
        out.seek(0)
        return code, out.read()


class TorchEngine(unittest.TestCase):
    def assert_holds(self, engine, full, draft_before=None):
        for rank, held in enumerate(engine.params()):
            expected = expected_worker(full, rank, engine.tp)
            self.assertEqual(set(held["target"]), set(expected))
            for name, t in expected.items():
                self.assertTrue(
                    torch.equal(held["target"][name], t),
                    f"TP{engine.tp} worker {rank}: {name} differs from the narrowed slice",
                )
            if draft_before is not None:
                for name, t in draft_before[rank]["draft"].items():
                    self.assertTrue(
                        torch.equal(held["draft"][name], t), f"draft {name} changed on worker {rank}"
                    )

    def assert_serve(self, engines, drafts, full, version):
        """Every engine holds `full` (narrowed per worker) with its draft as in `drafts`, and
        /generate at `version` matches the single-process reference."""
        for engine, before in zip(engines, drafts):
            self.assert_holds(engine, full, draft_before=before)
            answer = engine.generate(PROMPT, 8)
            self.assertEqual(answer["meta_info"]["weight_version"], version)
            self.assertEqual(answer["output_ids"], reference_generate(full, PROMPT, 8))

    def test_trainer_update(self):
        """TP 2 and TP 1 engines, trainer tp 2 x pp 2, delta on, 5 steps, --verify."""
        with torch_engines.running([2, 1], SEED, ["--delta"]) as engines:
            # The announce SGLang's plug-in gives, here with our native routes: flavor weightcast.
            announce = engines[0].ok("/server_info")["internal_states"][0]["weightcast"]
            self.assertTrue(announce["native_routes"])
            drafts = [e.params() for e in engines]
            self.assert_holds(engines[0], full_tensors(0))
            code, out = torch_engines.train(engines, 5, SEED, ["--verify", "--delta", "on"])
            self.assertEqual(code, 0, out)
            self.assertIn(f"engine {engines[0].url} flavor weightcast", out)
            self.assertIn("step 5/5 version 5", out)
            self.assertIn("verified yes", out)
            # Deltas really travelled and were applied to the receivers' kept bases.
            self.assertRegex(out, r"step 2/5 .*delta_buckets [1-9]")
            full = full_tensors(5)
            self.assert_serve(engines, drafts, full, "5")
            for engine in engines:
                info = engine.ok("/debug/info")["workers"]
                self.assertTrue(all(w["delta_base_bytes"] > 0 for w in info))
            # Layer order, and zero copy: within each load call the views of one bucket sit
            # back to back in one staged block (gaps below the bucket alignment), never copies.
            order = [name for name, ptr, size in engines[0].params()[0]["loaded_order"]]
            last = order[-len(full) :]
            layers = [int(n.split(".")[2]) for n in last if n.startswith("model.layers.")]
            self.assertEqual(layers, sorted(layers))
            self.assertEqual(last[0], "model.embed_tokens.weight")
            # The front (HTTP routes, sessions, the TP group's store) never loads torch: only its
            # workers do, so an engine is up a torch import sooner.
            for engine in engines:
                with open(f"/proc/{engine.proc.pid}/maps") as f:
                    self.assertFalse("libtorch" in f.read(), "the engine's front process loaded torch")

    def test_colocated_trainer_update(self):
        """weightcast-train --colocate on (tp 2 x pp 2) updates a TP-2 and a TP-1 torch engine
        through shared memory: every TP worker copies each bucket out of the trainer's segment.
        Every worker holds the narrowed slices of what was sent, the draft is bit-identical, and
        /generate matches the single-process reference."""
        with torch_engines.running([2, 1], SEED, []) as engines:
            self.assertTrue(engines[0].ok("/server_info")["colocate_host"])
            drafts = [e.params() for e in engines]
            code, out = torch_engines.train(engines, 3, SEED, ["--verify", "--colocate", "on"])
            self.assertEqual(code, 0, out)
            for engine in engines:
                self.assertIn(f"engine {engine.url} flavor weightcast path colocated", out)
            self.assertRegex(out, r"step 3/3 version 3 .* verified yes .* path colocated ")
            self.assert_serve(engines, drafts, full_tensors(3), "3")

    def test_colocated_bucket(self):
        """POST /update_weights_from_tensor in weightcast's segment form: a Python trainer lays the
        target out in a sealed memfd segment and serves it to both TP workers, which copy it into
        staging; end_weight_update commits it, the draft stays bit-identical, /generate matches the
        reference. The torch-pickled form and a foreign token are 400s that change nothing."""
        import threading

        full = full_tensors(1)
        with torch_engines.running([2], SEED, []) as (e,):
            before = e.params()
            layout, offset, blob = [], 0, bytearray()
            digests = []
            for name, t in full.items():
                raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                layout.append(
                    {
                        "name": name,
                        "dtype": str(t.dtype).replace("torch.", ""),
                        "shape": list(t.shape),
                        "offset": offset,
                    }
                )
                digests.append(_weightcast._tensor_digest(raw))
                blob += raw
                offset += len(raw)
            bucket = _weightcast._ColocatedBucket(bytes(blob))
            body = {
                "load_format": "weightcast_segment",
                "manifest": layout,
                "digests": digests,
                "segment": {"socket": bucket.socket, "size": bucket.size},
                "selector": "target",
            }
            pickled = {"serialized_named_tensors": ["gASV"], "load_format": "flattened_bucket"}
            status, answer = e.call("/update_weights_from_tensor", pickled)
            self.assertEqual(status, 400, answer)
            self.assertIn("unpickling runs code", answer["message"])
            session = e.ok("/begin_weight_update", {"selector": "target", "holder": "trainer"})["session_id"]
            server = threading.Thread(target=bucket.serve, args=("f" * 32, 2, 30.0))
            server.start()  # a foreign token: every worker refuses the handle
            status, answer = e.call("/update_weights_from_tensor", dict(body, session_id=session))
            server.join()
            self.assertEqual(status, 400, answer)
            e.ok("/abort_weight_update", {"session_id": session})
            session = e.ok("/begin_weight_update", {"selector": "target", "holder": "trainer"})["session_id"]
            server = threading.Thread(target=bucket.serve, args=(session, 2, 30.0))
            server.start()
            e.ok("/update_weights_from_tensor", dict(body, session_id=session))
            server.join()
            e.ok("/end_weight_update", {"session_id": session})
            self.assert_holds(e, full, draft_before=before)
            self.assertEqual(e.generate(PROMPT, 8)["output_ids"], reference_generate(full, PROMPT, 8))

    def test_colocated_miles_sender(self):
        """A Miles-style sender (tests/python/miles_sender.py, a torch process of its own: flattened
        buckets, one ForkingPickler pickle per TP rank) drives the torch engine through
        /update_weights_from_tensor. Without WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION the pickled
        form is a 400 naming the flag; opted in, a TP-2 engine takes 2 steps of it, then a third
        in weightcast's segment form. A descriptor-shared pickle and a non-pickle entry for one
        rank are 400s that commit nothing. Workers hold the narrowed slices, the draft is
        bit-identical, /generate matches the reference, and /dev/shm is as before."""
        shm = sorted(os.listdir("/dev/shm"))
        opt_in = {"WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION": "1"}
        with torch_engines.running([1], SEED, []) as (closed,), torch_engines.running(
            [2], SEED, [], opt_in
        ) as (e,):
            code, out = miles_send(closed, "1", ["--expect", "400"])
            self.assertEqual(code, 0, out)
            self.assertIn("WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1", out)
            self.assertEqual(closed.generate(PROMPT, 1)["meta_info"]["weight_version"], "default")
            drafts = [e.params()]
            code, out = miles_send(e, "1:2", ["--tp-size", "2"])
            self.assertEqual(code, 0, out)
            self.assertEqual(out.count('"route": "end", "status": 200'), 2, out)
            self.assert_serve([e], drafts, full_tensors(2), "2")
            for refused, why in (
                (["--sharing", "file_descriptor"], "file_system"),
                (["--corrupt-rank", "1"], "does not unpickle"),
            ):
                code, out = miles_send(e, "3", ["--tp-size", "2", "--expect", "400", *refused])
                self.assertEqual(code, 0, out)
                self.assertIn(why, out)
                self.assertEqual(e.generate(PROMPT, 1)["meta_info"]["weight_version"], "2")
            code, out = miles_send(e, "3", ["--tp-size", "2", "--form", "segment"])
            self.assertEqual(code, 0, out)
            self.assert_serve([e], drafts, full_tensors(3), "3")
        deadline = time.monotonic() + 10  # torch's shm manager unlinks a gone sender's files
        while sorted(os.listdir("/dev/shm")) != shm and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(sorted(os.listdir("/dev/shm")), shm)

    def test_views_are_zero_copy(self):
        with torch_engines.running([1], SEED) as engines:
            code, out = torch_engines.train(engines, 1, SEED, ["--bucket-bytes", "64M"], tp=1, pp=1)
            self.assertEqual(code, 0, out)
            seen = engines[0].params()[0]["loaded_order"]
            self.assertEqual(len(seen), len(full_tensors(1)))
            spans = sorted((ptr, size) for _, ptr, size in seen)
            # One bucket: every view lies in one block at the packer's aligned offsets.
            for (a, n), (b, _) in zip(spans, spans[1:]):
                self.assertGreaterEqual(b - (a + n), 0)
                self.assertLess(b - (a + n), 256, "views are not back to back in one staged block")

    def test_peak_rss_1gib(self):
        """A 1 GiB update adds at most one bucket to a worker's peak RSS beyond its staging
        pool (reserved at start): the load callbacks get views, nobody copies the update."""
        bucket = 64 << 20
        with torch_engines.running([1], SEED, ["--model", "small", "--num-layers", "170", "--no-draft"]) as (
            e,
        ):
            e.ok("/debug/reset_peak", {})
            (before,) = e.ok("/debug/info")["workers"]
            code, out = torch_engines.train(
                [e],
                1,
                SEED,
                ["--model", "small", "--num-layers", "170", "--bucket-bytes", "64M"],
                tp=1,
                pp=1,
                timeout=400,
            )
            self.assertEqual(code, 0, out)
            (after,) = e.ok("/debug/info")["workers"]
            sent = after["bytes_received"]
            self.assertGreaterEqual(sent, 1 << 30)
            slack = 48 << 20  # interpreter and allocator noise
            self.assertLessEqual(after["staging_pool_bytes"], sent + sent // 64 + (4 << 20) + bucket)
            grew = after["peak_rss"] - before["rss"]
            print(
                f"1 GiB update: peak RSS grew {grew / 2**20:.1f} MiB; staging pool "
                f"{after['staging_pool_bytes'] / 2**20:.1f} MiB (reserved at start)"
            )
            self.assertLessEqual(
                grew, bucket + slack, f"peak RSS grew {grew} bytes during a {sent}-byte update"
            )

    def test_failed_updates_change_nothing(self):
        with torch_engines.running(
            [2], SEED, ["--delta", "--comm-timeout", "15", "--session-timeout", "6"]
        ) as (e,):
            before = e.params()
            # 1. A load callback raising: the commit fails naming runner and tensor; what was
            # already loaded is loaded again from the kept base.
            e.ok("/debug/fail_load", {"tensor": "model.layers.1.mlp.down_proj.weight"})
            code, out = torch_engines.train([e], 1, SEED)
            self.assertNotEqual(code, 0, out)
            self.assertIn("failed in load of tensor 'model.layers.1.mlp.down_proj.weight'", out)
            self.assert_unchanged(e, before, "default")
            e.ok("/debug/fail_load", {"tensor": None})
            # 2. The trainer killed mid-update: small, slow buckets; killed once bytes arrived.
            argv = torch_engines.train_argv(
                [e], 1, SEED, ["--bucket-bytes", "128K", "--bucket-delay-ms", "400"]
            )
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=torch_engines._die_with_parent,
            )
            try:
                deadline = time.monotonic() + 60
                while not any(w["bytes_received"] for w in e.ok("/debug/info")["workers"]):
                    self.assertLess(time.monotonic(), deadline, "no bucket arrived")
                    time.sleep(0.05)
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            deadline = time.monotonic() + 60  # the session timeout, or a comm timeout if mid-bucket
            while any(w["in_session"] for w in e.ok("/debug/info")["workers"]):
                self.assertLess(time.monotonic(), deadline, "the dead trainer's session never ended")
                time.sleep(0.1)
            self.assert_unchanged(e, before, "default")
            # And a later update goes through.
            code, out = torch_engines.train([e], 1, SEED, ["--verify"])
            self.assertEqual(code, 0, out)

    def test_vllm_trainer_update(self):
        """The TP 2 engine serving vLLM's routes (--api vllm): weightcast-train detects the flavor
        from /server_info and drives /init_weight_transfer_engine ... /finish_weight_update;
        3 steps, delta on (vLLM's start answers no base digest, so buckets go in full), --verify."""
        with torch_engines.running([2], SEED, ["--delta", "--api", "vllm"]) as (e,):
            info = e.ok("/server_info")
            self.assertEqual(info["vllm_config"]["weight_transfer_config"], {"backend": "weightcast"})
            # The receiver announces itself (as the SGLang plug-in does), with runners for --verify.
            self.assertFalse(info["weightcast"]["native_routes"])
            self.assertEqual([r["name"] for r in info["weightcast"]["runners"]], ["target", "draft"])
            before = e.params()
            code, out = torch_engines.train([e], 3, SEED, ["--verify", "--delta", "on"])
            self.assertEqual(code, 0, out)
            self.assertIn(f"engine {e.url} flavor vllm", out)
            self.assertIn("step 3/3 version 3", out)
            self.assertIn("verified yes", out)
            self.assertNotIn("cannot verify", out)
            full = full_tensors(3)
            self.assert_holds(e, full, draft_before=before)
            self.assertEqual(e.ok("/weight_info")["weight_version"], "3")
            answer = e.generate(PROMPT, 8)
            self.assertEqual(answer["meta_info"]["weight_version"], "3")
            self.assertEqual(answer["output_ids"], reference_generate(full, PROMPT, 8))

    def test_colocated_vllm_ipc(self):
        """vLLM's ipc backend shape on the engine serving vLLM's routes: /update_weights with
        update_info {names, dtype_names, shapes, ipc_handles_pickled}, each handle torch's
        reduce_tensor of the trainer's tensor filed under the engine's device key ("cpu" here),
        pickled and base64-encoded as vLLM's http mode does. Without
        WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION it is a 400 naming the flag; opted in, 2 rounds of
        it commit (narrowed slices exact, draft bit-identical, /generate = reference); a handle of
        another device or of the wrong shape fails the round and nothing changes."""
        import base64
        import pickle

        from torch.multiprocessing.reductions import reduce_tensor

        def update_info(full, key="cpu", wrong_shape=None):
            names = list(full)
            handles = [{key: reduce_tensor(full[n].contiguous())} for n in names]
            shapes = [list(full[n].shape) for n in names]
            if wrong_shape is not None:
                shapes[wrong_shape] = [1]
            return {
                "names": names,
                "dtype_names": [str(full[n].dtype).split(".")[-1] for n in names],
                "shapes": shapes,
                "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode(),
            }

        def round_(engine, info, version):
            engine.ok("/start_weight_update", {})
            status, answer = engine.call("/update_weights", {"update_info": info})
            if status == 200:
                engine.ok("/finish_weight_update", {"weight_version": version})
            return status, answer

        opt_in = {"WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION": "1"}
        with torch_engines.running([1], SEED, ["--api", "vllm"]) as (closed,):
            status, answer = round_(closed, update_info(full_tensors(1)), "1")
            self.assertEqual(status, 400, answer)
            self.assertIn("WEIGHTCAST_ALLOW_INSECURE_SERIALIZATION=1", str(answer))
        with torch_engines.running([2], SEED, ["--api", "vllm"], opt_in) as (e,):
            before = [e.params()]
            for step in (1, 2):
                status, answer = round_(e, update_info(full_tensors(step)), str(step))
                self.assertEqual(status, 200, answer)
            self.assert_serve([e], before, full_tensors(2), "2")
            for bad, why in (
                ({"key": "GPU-0"}, "no handle for this device"),
                ({"wrong_shape": 3}, "opens as"),
            ):
                status, answer = round_(e, update_info(full_tensors(3), **bad), "3")
                self.assertGreaterEqual(status, 400, answer)
                self.assertIn(why, str(answer))
            self.assert_serve([e], before, full_tensors(2), "2")

    def test_vllm_failed_update_changes_nothing(self):
        """A bucket failing mid-way through /update_weights (refused by the engine once received,
        as a bucket whose bytes do not match their digests is) fails the update; the trainer
        aborts through /update_weights {"abort"} and resumes: previous version and weights on
        every worker, generation running, and the next update goes through."""
        with torch_engines.running(
            [2], SEED, ["--delta", "--api", "vllm", "--comm-timeout", "15", "--session-timeout", "6"]
        ) as (e,):
            before = e.params()
            e.ok("/debug/fail_bucket", {"sequence": 2})
            code, out = torch_engines.train([e], 1, SEED, ["--bucket-bytes", "256K"])
            self.assertNotEqual(code, 0, out)
            self.assertIn("flavor vllm", out)
            self.assertIn("POST /update_weights", out)
            self.assertIn("injected failure of bucket 2", out)
            self.assertTrue(all(not w["in_session"] for w in e.ok("/debug/info")["workers"]))
            self.assertEqual(e.ok("/weight_info")["weight_version"], "default")
            self.assert_unchanged(e, before, "default")
            # And the next update goes through.
            code, out = torch_engines.train([e], 1, SEED, ["--verify"])
            self.assertEqual(code, 0, out)
            self.assertIn("verified yes", out)

    def test_sglang_announce(self):
        """The TP 2 engine answering /server_info as SGLang does with the weightcast.sglang
        plug-in (--api sglang: ServerArgs fields, the announce in internal_states, no "success"):
        the trainer takes it for SGLang (its routes are SGLang's) and updates it in the common
        mode (torch store, one broadcast per tensor) through every worker's Receiver."""
        with torch_engines.running([2], SEED, ["--api", "sglang"]) as (e,):
            info = e.ok("/server_info")
            self.assertNotIn("success", info)
            self.assertFalse(info["internal_states"][0]["weightcast"]["native_routes"])
            before = e.params()
            code, out = torch_engines.train([e], 2, SEED)
            self.assertEqual(code, 0, out)
            self.assertIn(f"engine {e.url} flavor sglang", out)
            self.assertIn("step 2/2 version 2", out)
            full = full_tensors(2)
            self.assert_holds(e, full, draft_before=before)
            answer = e.generate(PROMPT, 8)
            self.assertEqual(answer["meta_info"]["weight_version"], "2")
            self.assertEqual(answer["output_ids"], reference_generate(full, PROMPT, 8))

    def test_worker_errors_name_the_cause(self):
        """A TP engine's answer names the worker that failed first, not the one that saw it leave:
        worker 1 timed out mid-copy, so worker 0 saw the ring close under it."""
        from weightcast.reference.workers import WorkerError, most_telling

        closed = WorkerError(
            {
                "status": 500,
                "message": "engine rank 0 (group rank 1), bucket 0: the "
                "connection to rank 2 closed [peer: rank 2]",
            }
        )
        timeout = WorkerError(
            {
                "status": 504,
                "message": "engine rank 1 (group rank 2), bucket 0: timed out after copying 1376256 bytes",
            }
        )
        for errors in ([(0, closed), (1, timeout)], [(1, timeout), (0, closed)]):
            e = most_telling(errors)
            self.assertEqual(e.status, 504)
            self.assertTrue(str(e).startswith(str(timeout)), str(e))
            self.assertIn(f"(also worker 0: {closed})", str(e))
        # A refusal or a load error over a timeout, which may be its consequence; its fields kept.
        load = WorkerError({"status": 500, "message": "load failed", "runner": "target", "tensor": "w"})
        e = most_telling([(0, timeout), (1, load)])
        self.assertEqual((e.status, e.info["tensor"]), (500, "w"))
        self.assertEqual(str(e), f"load failed (also worker 0: {timeout})")
        self.assertIs(most_telling([(1, timeout)]), timeout)

    def assert_unchanged(self, e, before, version):
        after = e.params()
        for rank in range(e.tp):
            for part in ("target", "draft"):
                for name, t in before[rank][part].items():
                    self.assertTrue(
                        torch.equal(after[rank][part][name], t), f"{part} {name} changed on {rank}"
                    )
        answer = e.generate(PROMPT, 4)  # still generating, on the previous weights
        self.assertEqual(answer["meta_info"]["weight_version"], version)
        self.assertEqual(answer["output_ids"], reference_generate(full_tensors(0), PROMPT, 4))

    def test_frozen_draft(self):
        """`all` with the old finalize corrupts the frozen draft; the Receiver's scoping does not."""
        with torch_engines.running([2, 1], SEED, []) as (fixed, _), torch_engines.running(
            [1], SEED, ["--legacy-finalize"]
        ) as (legacy,):
            draft_fc = full_tensors(0, "draft")["draft.fc.weight"]
            start = accept_length(full_tensors(0), draft_fc)
            self.assertGreater(start, 2.0, "the initial draft should be a good one")
            for e in (fixed, legacy):
                self.assertAlmostEqual(e.ok("/spec_accept_length")["accept_length"], start, places=6)
            drafts = fixed.params()
            code, out = torch_engines.train([fixed, legacy], 1, SEED, ["--selector", "all"])
            self.assertEqual(code, 0, out)
            # Same draft, new target: exactly the accept length of the unchanged draft.
            now = accept_length(full_tensors(1), draft_fc)
            self.assertAlmostEqual(fixed.ok("/spec_accept_length")["accept_length"], now, places=6)
            for rank, held in enumerate(fixed.params()):
                for name, t in drafts[rank]["draft"].items():
                    self.assertTrue(torch.equal(held["draft"][name], t), name)
            broken = legacy.ok("/spec_accept_length")["accept_length"]
            self.assertLess(broken, 1.5, f"legacy finalize left accept length {broken} (from {now:.2f})")


if __name__ == "__main__":
    unittest.main(verbosity=2)
