"""A Miles-style LoRA sender, as a process of its own: the adapter sync of SGLang's tensor route
(INTEROP.md §9: Miles syncs the whole adapter in one call, unload then load, and opens no
begin/end). Per step: POST /unload_lora_adapter {lora_name} (a 404 for an adapter not yet held is
fine), then POST /load_lora_adapter_from_tensors {lora_name, config_dict (PEFT's),
serialized_named_tensors (one base64 torch ForkingPickler pickle per engine TP rank, of one
flattened bucket: SGLang's flattened_bucket form), load_format "flattened_bucket"}. CPU tensors
are shared with the "file_system" strategy, the only one an unrelated process can open.

The adapter of step k is what weightcast-train --lora-rank sends at step k: the generator's bytes
of each PEFT name (weightcast._weightcast._fill_tensor), A [r, in] and B [out, r] for every targeted
module of the model's base weights. Prints one JSON line per answer; exits 0 when every load had
--expect's status, else 1.
"""

import argparse
import base64
import io
import json
import sys

import torch
import torch.multiprocessing
from multiprocessing.reduction import ForkingPickler

from miles_sender import call, flatten
from weightcast import _weightcast


def adapter(model, seed, step, rank, targets):
    """[(PEFT name, tensor)]: what weightcast-train --lora-rank sends at `step` (module docstring)."""
    out = []
    for name, dtype, shape, _ in _weightcast._model_tensors(model, "target", seed, 0):
        module = name[: -len(".weight")]
        if len(shape) != 2 or not name.endswith(".weight") or module.split(".")[-1] not in targets:
            continue
        for part, part_shape in (("A", [rank, shape[1]]), ("B", [shape[0], rank])):
            peft = f"base_model.model.{module}.lora_{part}.weight"
            raw = _weightcast._fill_tensor(peft, dtype, part_shape, seed, step)
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype))
            out.append((peft, t.view(part_shape)))
    return out


def load_body(args, step):
    flat, metadata = flatten(adapter(args.model, args.seed, step, args.rank, args.targets.split(",")))
    entries = []
    for _ in range(args.tp_size):  # one pickle per engine TP rank, as SGLang reads them
        buf = io.BytesIO()
        ForkingPickler(buf).dump({"flattened_tensor": flat, "metadata": metadata})
        entries.append(base64.b64encode(buf.getvalue()).decode())
    config = {"r": args.rank, "lora_alpha": args.alpha, "target_modules": args.targets.split(",")}
    return {
        "lora_name": args.name,
        "config_dict": config,
        "serialized_named_tensors": entries,
        "load_format": "flattened_bucket",
        "selector": args.selector,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", required=True, help="the engine's URL")
    p.add_argument("--tp-size", type=int, default=1, help="the engine's TP ranks (one pickle entry each)")
    p.add_argument("--name", default="miles")
    p.add_argument("--model", default="tiny")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--steps", default="1", help="first:last (inclusive) or one step")
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--alpha", type=float, default=8.0)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    p.add_argument("--selector", default="target", help="Miles' selector field on the request")
    p.add_argument("--expect", type=int, default=200, help="the status every load is expected to get")
    p.add_argument("--no-unload", action="store_true", help="load without unloading first")
    args = p.parse_args()
    torch.multiprocessing.set_sharing_strategy("file_system")
    first, _, last = args.steps.partition(":")
    for k in range(int(first), int(last or first) + 1):
        if not args.no_unload:
            status, answer = call(args.engine, "/unload_lora_adapter", {"lora_name": args.name})
            print(json.dumps({"route": "unload", "status": status, "answer": answer}), flush=True)
        status, answer = call(args.engine, "/load_lora_adapter_from_tensors", load_body(args, k))
        print(json.dumps({"route": "load", "status": status, "answer": answer}), flush=True)
        if status != args.expect:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
