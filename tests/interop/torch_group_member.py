"""One torch.distributed member of a group that weightcast processes join too.

Joins or hosts the group the way SGLang's init_custom_process_group does (a tcp:// rendezvous,
PrefixStore(group), torch's _new_process_group_helper) with the gloo backend, then runs one
ProcessGroup broadcast per spec entry, exactly as dist.broadcast(tensor, src=root) does.

  python3 torch_group_member.py --rank R --world N --group G --spec "int8:1,float32:1024"
                                (--host-store | --store-port P) [--root K] [--timeout-ms T]

Prints "port <p>" when hosting, "joined", then "digest <i> <xxh3-128 hex> <bytes> <seconds>" per
broadcast and "done"; on failure "error <type> <message>" and exit status 3. bfloat16 travels as a
uint8 view of the same bytes (torch 1.13's gloo backend refuses bfloat16 tensors).
Needs torch and xxhash only.
"""
import argparse
import datetime
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
import xxhash

DTYPES = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
}


def parse_spec(spec):
    out = []
    for item in spec.split(","):
        dtype, numel = item.split(":")
        out.append((DTYPES[dtype], int(numel)))
    return out


def form_group(args, timeout):
    if args.host_store:
        store = dist.TCPStore("127.0.0.1", 0, args.world, True, timeout, wait_for_workers=False)
        print("port", store.port, flush=True)
    else:
        url = f"tcp://127.0.0.1:{args.store_port}"
        store, _, _ = next(dist.rendezvous(url, args.rank, args.world, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(args.group, store)
    return c10d._new_process_group_helper(
        args.world, args.rank, [], "gloo", store, group_name=args.group, timeout=timeout
    )


def broadcast(pg, tensor, root):
    wire = tensor.view(torch.uint8) if tensor.dtype == torch.bfloat16 else tensor
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    opts.rootTensor = 0
    pg.broadcast([wire], opts).wait()


def run(args):
    timeout = datetime.timedelta(milliseconds=args.timeout_ms)
    pg = form_group(args, timeout)
    print("joined", flush=True)
    gen = torch.Generator().manual_seed(0x5EED + args.rank)
    for i, (dtype, numel) in enumerate(parse_spec(args.spec)):
        tensor = torch.zeros(numel, dtype=dtype)
        raw = tensor.view(torch.uint8)
        if args.rank == args.root:
            raw.copy_(torch.randint(0, 256, (raw.numel(),), dtype=torch.uint8, generator=gen))
        start = time.perf_counter()
        broadcast(pg, tensor, args.root)
        took = time.perf_counter() - start
        digest = xxhash.xxh3_128(memoryview(raw.numpy())).hexdigest()
        print("digest", i, digest, raw.numel(), f"{took:.6f}", flush=True)
    print("done", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--group", default="weight_update_group")
    p.add_argument("--spec", required=True)
    p.add_argument("--host-store", action="store_true")
    p.add_argument("--store-port", type=int, default=0)
    p.add_argument("--timeout-ms", type=int, default=30000)
    args = p.parse_args()
    try:
        run(args)
    except Exception as e:  # reported to the test driver, which checks the type
        kind = "TimeoutError" if "imeout" in str(e) else type(e).__name__
        print("error", kind, str(e).replace("\n", " "), flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
