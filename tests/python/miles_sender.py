"""A Miles-style colocated sender, as a process of its own: the trainer side of
update_weights_from_tensor the way Miles' update_weight_from_tensor.py drives SGLang.

Per step: begin_weight_update(selector), then per bucket one POST /update_weights_from_tensor with
a flattened bucket (each tensor `flatten().view(uint8)`, concatenated, with per-tensor metadata
name/shape/dtype/start_idx/end_idx/numel as SGLang's FlattenedTensorMetadata), then
end_weight_update. Forms (--form):
  pickled  Miles' own: one base64 torch ForkingPickler pickle per engine TP rank in
           serialized_named_tensors, load_format "flattened_bucket" (CPU tensors shared with
           --sharing, "file_system" by default: the only strategy an unrelated process can open)
  segment  weightcast's: the same bucket in a sealed memfd segment with a JSON manifest and
           digests (load_format "weightcast_segment"), served to --fetches engine processes
           (a torch engine's TP workers each fetch it; weightcast-engine fetches it once)
The weights of step k are the generator's (weightcast's _model_tensors, the trainer's --drift
jump). Prints one JSON line per request answer; exits 0 when every answer had --expect's status
(for a refusal: the sender aborts the session and stops at the first bucket), else 1.
"""

import argparse
import base64
import dataclasses
import io
import json
import sys
import threading
import urllib.error
import urllib.request

import torch
import torch.multiprocessing
from multiprocessing.reduction import ForkingPickler

from weightcast import _weightcast


@dataclasses.dataclass
class FlattenedTensorMetadata:  # the field names and order of SGLang's record
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def call(url, route, body, timeout=120):
    req = urllib.request.Request(
        url + route, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def tensors(model, seed, step):
    out = []
    for name, dtype, shape, raw in _weightcast._model_tensors(model, "target", seed, step):
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)
        out.append((name, t))
    return out


def buckets(named, limit):
    bucket, size = [], 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if bucket and size + n > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def flatten(bucket):
    parts, metadata, at = [], [], 0
    for name, t in bucket:
        flat = t.contiguous().flatten().view(torch.uint8)
        metadata.append(FlattenedTensorMetadata(name, t.shape, t.dtype, at, at + flat.numel(), flat.numel()))
        parts.append(flat)
        at += flat.numel()
    return torch.cat(parts), metadata


def pickled_body(bucket, tp_size, corrupt_rank):
    flat, metadata = flatten(bucket)
    entries = []
    for rank in range(tp_size):  # one pickle per engine TP rank, as Miles gathers them
        if rank == corrupt_rank:
            entries.append(base64.b64encode(b"not a pickle").decode())
            continue
        buf = io.BytesIO()
        ForkingPickler(buf).dump({"flattened_tensor": flat, "metadata": metadata})
        entries.append(base64.b64encode(buf.getvalue()).decode())
    return {"serialized_named_tensors": entries, "load_format": "flattened_bucket"}, None


def segment_body(bucket, fetches, session):
    flat, metadata = flatten(bucket)
    data = flat.numpy().tobytes()
    segment = _weightcast._ColocatedBucket(data)
    manifest = [
        {
            "name": m.name,
            "dtype": str(m.dtype).replace("torch.", ""),
            "shape": list(m.shape),
            "offset": m.start_idx,
        }
        for m in metadata
    ]
    digests = [_weightcast._tensor_digest(data[m.start_idx : m.end_idx]) for m in metadata]
    server = threading.Thread(target=segment.serve, args=(session, fetches, 60.0))
    server.start()
    body = {
        "load_format": "weightcast_segment",
        "manifest": manifest,
        "digests": digests,
        "segment": {"socket": segment.socket, "size": segment.size},
    }
    return body, (server, segment)


def step(args, k):
    """One update; returns whether every answer had the expected status."""
    status, begun = call(args.engine, "/begin_weight_update", {"selector": args.selector})
    print(json.dumps({"route": "begin", "status": status, "answer": begun}), flush=True)
    if status != 200:
        return False
    session = begun["session_id"]
    for bucket in buckets(tensors(args.model, args.seed, k), args.bucket_bytes):
        if args.form == "pickled":
            body, serving = pickled_body(bucket, args.tp_size, args.corrupt_rank)
        else:
            body, serving = segment_body(bucket, args.fetches or args.tp_size, session)
        body.update(
            session_id=session,
            selector=args.selector,
            weight_version=str(k),
            flush_cache=True,
            abort_all_requests=False,
        )
        status, answer = call(args.engine, "/update_weights_from_tensor", body)
        if serving is not None:
            serving[0].join()
        print(
            json.dumps({"route": "update_weights_from_tensor", "status": status, "answer": answer}),
            flush=True,
        )
        if status != 200:
            call(args.engine, "/abort_weight_update", {"session_id": session})
            return status == args.expect
    status, answer = call(args.engine, "/end_weight_update", {"session_id": session})
    print(json.dumps({"route": "end", "status": status, "answer": answer}), flush=True)
    return status == 200 == args.expect


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", required=True, help="the engine's URL")
    p.add_argument("--tp-size", type=int, default=1, help="the engine's TP ranks (one pickle entry each)")
    p.add_argument("--form", choices=("pickled", "segment"), default="pickled")
    p.add_argument(
        "--fetches", type=int, default=0, help="processes that fetch each segment (default: --tp-size)"
    )
    p.add_argument("--sharing", choices=("file_system", "file_descriptor"), default="file_system")
    p.add_argument("--steps", default="1", help="first:last (inclusive) or one step")
    p.add_argument("--model", default="tiny")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--selector", default="target")
    p.add_argument("--bucket-bytes", type=int, default=64 << 10)
    p.add_argument(
        "--corrupt-rank", type=int, default=-1, help="send this rank an entry that is not a pickle"
    )
    p.add_argument("--expect", type=int, default=200, help="the status every bucket is expected to get")
    args = p.parse_args()
    torch.multiprocessing.set_sharing_strategy(args.sharing)
    first, _, last = args.steps.partition(":")
    for k in range(int(first), int(last or first) + 1):
        if not step(args, k):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
