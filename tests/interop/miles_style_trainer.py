"""A trainer that drives weight-update engines exactly the way Miles drives SGLang.

Usage: miles_style_trainer.py --engines URL[,URL...] --ranks N[,N...] [--steps 3]
           [--selector target] [--group miles-pp_0] [--timeout 60]

Rank 0 of a torch.distributed group (gloo): it hosts the c10d TCPStore, asks every engine to
join (init_weights_update_group, asynchronously, as Miles does through Ray), forms the group the
way SGLang's init_custom_process_group does (PrefixStore(group) + _new_process_group_helper),
then per step: pause_generation {mode}, GET flush_cache, begin_weight_update {selector}, bucket
requests without sequence or load_format, each followed by one dist.broadcast per tensor in
`names` order, update_weight_version, end_weight_update, continue_generation. Tensors are the
target runner's list (names, dtypes, shapes) read from the first engine, filled with seeded
random bytes; they travel as uint8 views (torch 1.13's gloo refuses bfloat16).

Prints one JSON line per step: {"step", "digests": {name: xxh3_128 hex}, "bytes", "seconds"}.
Standard library, torch and xxhash only.
"""
import argparse
import datetime
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import torch
import torch.distributed as dist
import xxhash

from sglang_compat import custom_group


def call(url, route, body=None, method="POST", timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url + route, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            text = res.read().decode()
            return res.status, text
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def ok(url, route, body=None, method="POST", timeout=60):
    status, text = call(url, route, body, method, timeout)
    if status // 100 != 2:
        sys.exit(f"{url} {method} {route}: HTTP {status}: {text}")
    return text


def flush(url, attempts=60, pause=1.0):
    """GET /flush_cache until it answers 200, as Miles does (SGLang refuses while requests hold
    cache blocks)."""
    for attempt in range(attempts):
        status, text = call(url, "/flush_cache", method="GET")
        if status == 200:
            return
        if attempt + 1 < attempts:
            time.sleep(pause)
    sys.exit(f"{url} GET /flush_cache: HTTP {status} after {attempts} attempts: {text}")


def target_tensors(url, timeout):
    answer = json.loads(ok(url, "/weights_checksum?runner=target", method="GET", timeout=timeout))
    return [(t["name"], t["dtype"], t["shape"]) for t in answer["tensors"]]


def nbytes(dtype, shape):
    size = {"bfloat16": 2, "float16": 2, "float32": 4, "int8": 1, "uint8": 1}[dtype]
    for d in shape:
        size *= d
    return size


def buckets(metas, limit):
    out, cur, size = [], [], 0
    for m in metas:
        b = nbytes(m[1], m[2])
        if cur and size + b > limit:
            out.append(cur)
            cur, size = [], 0
        cur.append(m)
        size += b
    if cur:
        out.append(cur)
    return out


def join_group(args, urls, ranks, timeout):
    world = 1 + sum(ranks)
    store = dist.TCPStore("127.0.0.1", 0, world, True, timeout, wait_for_workers=False)
    port = store.port
    errors = []

    def init(url, offset):
        call(url, "/destroy_weights_update_group", {"group_name": args.group})  # errors ignored
        status, text = call(
            url,
            "/init_weights_update_group",
            {
                "master_address": "127.0.0.1",
                "master_port": port,
                "rank_offset": offset,
                "world_size": world,
                "group_name": args.group,
                "backend": "gloo",
            },
            timeout=args.timeout,
        )
        if status != 200:
            errors.append(f"{url}: HTTP {status}: {text}")

    threads, offset = [], 1
    for url, n in zip(urls, ranks):
        threads.append(threading.Thread(target=init, args=(url, offset)))
        offset += n
    for t in threads:
        t.start()
    pg = custom_group(store, world, 0, args.group, "gloo", timeout)
    for t in threads:
        t.join(args.timeout)
    if errors:
        sys.exit("init failed: " + "; ".join(errors))
    return store, pg


def send_bucket(args, urls, pg, bucket, gen, extra, digests):
    """One bucket request to every engine at once (`extra`: the body's fields besides the
    tensor lists and group), then one async dist.broadcast per tensor in `names` order, as Miles
    and slime send them; exits unless every engine answers 200. Adds the XXH3-128 of each sent
    tensor to `digests`; returns the bytes sent."""
    tensors = [torch.randint(0, 256, (nbytes(d, s),), dtype=torch.uint8, generator=gen) for _, d, s in bucket]
    body = {
        "names": [m[0] for m in bucket],
        "dtypes": [m[1] for m in bucket],
        "shapes": [m[2] for m in bucket],
        "group_name": args.group,
        **extra,
    }
    answers = [None] * len(urls)

    def post(i):
        answers[i] = call(urls[i], "/update_weights_from_distributed", body, timeout=args.timeout)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    works = [dist.broadcast(t, src=0, group=pg, async_op=True) for t in tensors]
    for w in works:
        w.wait()
    for t in threads:
        t.join(args.timeout)
    for url, a in zip(urls, answers):
        if a is None or a[0] != 200:
            sys.exit(f"{url} update_weights_from_distributed: {a}")
    sent = 0
    for (name, _, _), t in zip(bucket, tensors):
        digests[name] = xxhash.xxh3_128(t.numpy().tobytes()).hexdigest()
        sent += t.numel()
    return sent


def update(args, urls, pg, metas, step):
    version = str(step)
    gen = torch.Generator().manual_seed(1000 + step)
    start = time.monotonic()
    for url in urls:
        ok(url, "/pause_generation", {"mode": "retract"})
        flush(url)
        ok(url, "/begin_weight_update", {"selector": args.selector})
    digests, total = {}, 0
    # As Miles does: the non-expert buckets first, then the expert buckets (which Miles fills
    # after an all-gather over the expert-parallel group); a dense model has none.
    dense = [m for m in metas if ".mlp.experts." not in m[0]]
    experts = [m for m in metas if ".mlp.experts." in m[0]]
    dense_buckets, expert_buckets = buckets(dense, args.bucket_bytes), buckets(experts, args.bucket_bytes)
    for bucket in dense_buckets + expert_buckets:
        extra = {"flush_cache": False, "selector": args.selector, "weight_version": version}
        total += send_bucket(args, urls, pg, bucket, gen, extra, digests)
    for url in urls:
        ok(url, "/update_weight_version", {"new_version": version, "abort_all_requests": False})
        ok(url, "/end_weight_update", {})
        ok(url, "/continue_generation", {})
    seconds = time.monotonic() - start
    print(
        json.dumps(
            {
                "step": step,
                "digests": digests,
                "bytes": total,
                "seconds": seconds,
                "dense_buckets": len(dense_buckets),
                "expert_buckets": len(expert_buckets),
            }
        ),
        flush=True,
    )


def run(update_fn, group):
    """The command line both senders share: join the engines' group, then `update_fn` per step."""
    p = argparse.ArgumentParser()
    p.add_argument("--engines", required=True)
    p.add_argument("--ranks", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--selector", default="target")
    p.add_argument("--group", default=group)
    p.add_argument("--bucket-bytes", type=int, default=1 << 20)
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()
    urls = args.engines.split(",")
    ranks = [int(r) for r in args.ranks.split(",")]
    timeout = datetime.timedelta(seconds=args.timeout)
    metas = target_tensors(urls[0], args.timeout)
    store, pg = join_group(args, urls, ranks, timeout)
    for step in range(1, args.steps + 1):
        update_fn(args, urls, pg, metas, step)
    del pg, store


if __name__ == "__main__":
    run(update, "miles-pp_0")
