"""A sender that drives weight-update engines the way slime drives SGLang: no sessions.

Usage: slime_style_sender.py --engines URL[,URL...] --ranks N[,N...] [--steps 3]
           [--group slime-pp_0] [--bucket-bytes B] [--timeout 60]

As tests/interop/miles_style_trainer.py (torch rank 0 hosting the c10d store, the group formed
as SGLang's init_custom_process_group does, gloo, one dist.broadcast per tensor), but per step
slime's sequence: POST /pause_generation {} (SGLang's default mode), GET /flush_cache (retried
while non-200), bucket requests with no begin_weight_update, no selector and the step's
weight_version in every bucket, POST /continue_generation {}, then the version read back from
GET /get_weight_version, which must be the step's. Success is judged by HTTP status only.

Prints one JSON line per step: {"step", "digests": {name: xxh3_128 hex}, "bytes", "seconds"}.
"""
import json
import sys
import time

import torch

from miles_style_trainer import buckets, flush, ok, run, send_bucket


def update(args, urls, pg, metas, step):
    version = str(step)
    gen = torch.Generator().manual_seed(2000 + step)
    start = time.monotonic()
    for url in urls:
        ok(url, "/pause_generation", {})
        flush(url)
    digests, total = {}, 0
    for bucket in buckets(metas, args.bucket_bytes):
        # No selector, no session: slime's body; the version rides in every bucket.
        extra = {"flush_cache": False, "weight_version": version}
        total += send_bucket(args, urls, pg, bucket, gen, extra, digests)
    for url in urls:
        ok(url, "/continue_generation", {})
        held = json.loads(ok(url, "/get_weight_version", method="GET"))["weight_version"]
        if held != version:
            sys.exit(f"{url} /get_weight_version: {held!r}, expected {version!r}")
    seconds = time.monotonic() - start
    print(json.dumps({"step": step, "digests": digests, "bytes": total, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    run(update, "slime-pp_0")
