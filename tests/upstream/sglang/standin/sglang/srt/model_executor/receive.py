"""SGLang's per-tensor receive (model_runner.py / weight_updater.py, every version here): one
``torch.distributed.broadcast(src=0, async_op=True)`` per tensor in ``names`` order into a fresh
tensor, then wait for all. Debian's torch 1.13 gloo refuses bfloat16, so a tensor is received
as the uint8 view of its bytes (the senders here broadcast the same view)."""

import torch
import torch.distributed as dist


def receive(names, dtypes, shapes, group):
    out, works = [], []
    for name, dtype, shape in zip(names, dtypes, shapes):
        dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
        raw = torch.empty(
            int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size(), dtype=torch.uint8
        )
        works.append(dist.broadcast(raw, src=0, group=group, async_op=True))
        out.append((name, raw, dtype, shape))
    for w in works:
        w.wait()
    return [(name, raw.view(dtype).view(shape)) for name, raw, dtype, shape in out]
