"""A small tensor-parallel transformer LM in torch, loaded the way vLLM and SGLang load models.

Each TP rank holds only its shard: vocabulary-parallel embed_tokens and lm_head, fused
column-parallel ``qkv_proj`` ([q; k; v] heads of this rank) and ``gate_up_proj`` ([gate; up]),
row-parallel ``o_proj`` and ``down_proj``, replicated norms. ``load_weights(iterable of (hf_name,
full tensor))`` maps HF names onto these parameters and narrows each full tensor into the rank's
shard **in place** (``param.data.copy_``), as the engines' weight loaders do, so parameter storage
never moves (CUDA graphs and compiled code hold its address).

The model is Llama/Qwen2-shaped (RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP),
with the names and shapes of weightcast's model presets (sync/model/model.h). Parameters keep the
dtype the trainer sends (bfloat16): loading is bit-exact. Forward runs in float64, so greedy
decoding agrees between TP sizes (partial sums in other orders differ far below argmax margins).

Mixture-of-experts presets (``moe-tiny``) get a router and experts split over expert-parallel
ranks instead of the dense MLP (reference/moe.py); the draft stays dense.

The EAGLE-style draft (``draft.fc``, ``draft.layers.0.*``, ``draft.norm``) is replicated. Its
post-load processing applies weightcast's tiled shuffle (sync/model/layout.h) to its weights in
place, as ROCm's kernels want their tiled layout, and its kernels read the weights unshuffled:
run twice, the shuffle leaves a layout the kernels misread (the double-shuffle bug).
"""

import json
import math

import torch
import torch.distributed as dist

from .. import _weightcast
from .moe import MoeMlp

FUSED = {  # HF name suffix -> (fused parameter, shard id)
    "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", "q"),
    "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", "k"),
    "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", "v"),
    "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0),
    "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", 1),
}
ROW_PARALLEL = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def model_spec(preset):
    return json.loads(_weightcast._model_spec(preset))


class Parallel:
    """This process's place in the TP group (torch.distributed, gloo) or a single process, and
    how many expert-parallel ranks the group's experts are split over (``ep`` divides ``size``)."""

    def __init__(self, rank=0, size=1, ep=1):
        self.rank, self.size, self.ep = rank, size, ep

    def all_reduce(self, t):
        if self.size > 1:
            dist.all_reduce(t)
        return t

    def all_gather_cat(self, t, dim):
        if self.size == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=dim)

    def all_gather_list(self, t):
        """`t` of every rank, in rank order."""
        if self.size == 1:
            return [t]
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.contiguous())
        return parts


def _narrow(full, dim, tp):
    size = full.shape[dim] // tp.size
    return full.narrow(dim, tp.rank * size, size)


class Layer(torch.nn.Module):
    """One decoder layer's shard; `moe`: experts (reference/moe.py) instead of the dense MLP."""

    def __init__(self, spec, tp, dtype, moe=False):
        super().__init__()
        self.moe = moe
        h, hd = spec["hidden_size"], spec["head_dim"]
        kv = spec["num_key_value_heads"]
        if kv % tp.size and tp.size % kv:
            raise ValueError(f"{kv} KV heads over {tp.size} TP ranks: one must divide the other")
        # With fewer KV heads than ranks, each group of tp / kv ranks keeps one KV head.
        self.heads, self.kv_heads = spec["num_attention_heads"] // tp.size, max(1, kv // tp.size)
        self.kv_total = kv
        self.hd, self.tp = hd, tp
        ff = spec["intermediate_size"] // tp.size
        p = lambda *shape: torch.nn.Parameter(
            torch.zeros(*shape, dtype=dtype), requires_grad=False
        )  # noqa: E731
        self.input_layernorm = torch.nn.Module()
        self.input_layernorm.weight = p(h)
        self.post_attention_layernorm = torch.nn.Module()
        self.post_attention_layernorm.weight = p(h)
        self.self_attn = torch.nn.Module()
        self.self_attn.qkv_proj = torch.nn.Module()
        self.self_attn.qkv_proj.weight = p((self.heads + 2 * self.kv_heads) * hd, h)
        self.self_attn.o_proj = torch.nn.Module()
        self.self_attn.o_proj.weight = p(h, self.heads * hd)
        if moe:
            self.mlp = MoeMlp(spec, tp, dtype)
            return
        self.mlp = torch.nn.Module()
        self.mlp.gate_up_proj = torch.nn.Module()
        self.mlp.gate_up_proj.weight = p(2 * ff, h)
        self.mlp.down_proj = torch.nn.Module()
        self.mlp.down_proj.weight = p(h, ff)

    def weight_loader(self, suffix, full):
        """Narrows the full HF tensor `suffix` into this rank's shard, in place."""
        if self.moe and suffix.startswith("mlp."):
            self.mlp.weight_loader(suffix[len("mlp.") :], full)
            return
        part = self.shard_of(suffix, full)
        if suffix in FUSED:
            fused, start, size = self.fused_span(suffix)
            self.get_parameter(fused).data.narrow(0, start, size).copy_(part)
        else:
            self.get_parameter(suffix).data.copy_(part)

    def shard_of(self, suffix, full):
        """This rank's shard of `full`, split as HF weight `suffix` is: the rank's rows (its KV
        heads for k/v) of a column-parallel weight, its columns of a row-parallel one, else whole.
        (A LoRA B splits as its weight's rows, a LoRA A as its weight's columns: reference/lora.py.)"""
        if suffix in FUSED:
            return self._kv_narrow(full) if FUSED[suffix][1] in ("k", "v") else _narrow(full, 0, self.tp)
        if suffix in ROW_PARALLEL:
            return _narrow(full, 1, self.tp)
        return full

    def fused_span(self, suffix):
        """(fused parameter, first row, rows) that HF weight `suffix` takes in this rank's fused
        parameter."""
        fused, shard = FUSED[suffix]
        if fused.startswith("self_attn"):
            q, kv = self.heads * self.hd, self.kv_heads * self.hd
            start, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard]
        else:
            size = self.get_parameter(fused).shape[0] // 2
            start = shard * size
        return fused, start, size

    def _kv_narrow(self, full):
        """This rank's KV heads of a full k_proj/v_proj: its block, or the one head its group of
        tp / kv ranks shares."""
        tp = self.tp
        if self.kv_total >= tp.size:
            return _narrow(full, 0, tp)
        head = tp.rank // (tp.size // self.kv_total)
        return full.narrow(0, head * self.hd, self.hd)

    @staticmethod
    def _w(weight, name, lora):
        """`weight` (parameter `name`) in float64, plus its LoRA delta when the request has one."""
        w = weight.to(torch.float64)
        return w + lora[name] if lora and name in lora else w

    def forward(self, x, cos, sin, lora=None):
        f = torch.float64
        h = rms_norm(x, self.input_layernorm.weight)
        qkv = h @ self._w(self.self_attn.qkv_proj.weight, "self_attn.qkv_proj.weight", lora).t()
        q_size, kv_size = self.heads * self.hd, self.kv_heads * self.hd
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        n = x.shape[0]
        q = rope(q.view(n, self.heads, self.hd), cos, sin)
        k = rope(k.view(n, self.kv_heads, self.hd), cos, sin)
        v = v.view(n, self.kv_heads, self.hd)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.hd)
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        attn = scores.masked_fill(mask, float("-inf")).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", attn, v).reshape(n, q_size)
        x = x + self.tp.all_reduce(
            out @ self._w(self.self_attn.o_proj.weight, "self_attn.o_proj.weight", lora).t()
        )
        h = rms_norm(x, self.post_attention_layernorm.weight)
        if self.moe:
            return x + self.mlp(h)
        gate, up = (h @ self._w(self.mlp.gate_up_proj.weight, "mlp.gate_up_proj.weight", lora).t()).chunk(
            2, dim=-1
        )
        return x + self.tp.all_reduce(
            (torch.nn.functional.silu(gate) * up)
            @ self._w(self.mlp.down_proj.weight, "mlp.down_proj.weight", lora).t()
        )


def rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(torch.float64)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_tables(n, head_dim, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim // 2, dtype=torch.float64) * 2 / head_dim))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos()[:, None, :], ang.sin()[:, None, :]


class TargetModel(torch.nn.Module):
    """The target LM's shard on one TP rank."""

    def __init__(self, spec, tp, dtype=torch.bfloat16):
        super().__init__()
        self.spec, self.tp = spec, tp
        v, h = spec["vocab_size"], spec["hidden_size"]
        p = lambda *shape: torch.nn.Parameter(
            torch.zeros(*shape, dtype=dtype), requires_grad=False
        )  # noqa: E731
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Module()
        self.model.embed_tokens.weight = p(v // tp.size, h)
        first_moe = spec.get("first_k_dense_replace") or 0
        self.model.layers = torch.nn.ModuleList(
            Layer(spec, tp, dtype, moe=bool(spec.get("num_experts")) and i >= first_moe)
            for i in range(spec["num_hidden_layers"])
        )
        self.model.norm = torch.nn.Module()
        self.model.norm.weight = p(h)
        self.lm_head = torch.nn.Module()
        self.lm_head.weight = p(v // tp.size, h)

    def load_weights(self, weights):
        """vLLM/SGLang's contract: (hf_name, full tensor) pairs; each is narrowed in place."""
        loaded = []
        for name, full in weights:
            if name.startswith("model.layers."):
                index, suffix = name[len("model.layers.") :].split(".", 1)
                self.model.layers[int(index)].weight_loader(suffix, full)
            elif name in ("model.embed_tokens.weight", "lm_head.weight"):
                self.get_parameter(name).data.copy_(_narrow(full, 0, self.tp))
            elif name == "model.norm.weight":
                self.model.norm.weight.data.copy_(full)
            else:
                raise KeyError(f"target has no parameter for '{name}'")
            loaded.append(name)
        return loaded

    def embed(self, ids):
        per = self.model.embed_tokens.weight.shape[0]
        local = ids - self.tp.rank * per
        inside = (local >= 0) & (local < per)
        rows = self.model.embed_tokens.weight.to(torch.float64)[local.clamp(0, per - 1)]
        return self.tp.all_reduce(rows * inside[:, None])

    def hidden(self, ids, deltas=None):
        """`deltas`: per layer, {parameter: float64 delta} of a LoRA adapter (reference/lora.py)."""
        x = self.embed(ids)
        cos, sin = rope_tables(len(ids), self.spec["head_dim"])
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, deltas[i] if deltas else None)
        return rms_norm(x, self.model.norm.weight)

    def logits(self, h):
        return self.tp.all_gather_cat(h @ self.lm_head.weight.to(torch.float64).t(), dim=-1)

    def full_tensor(self, name):
        """The full tensor `name` as loaded (all ranks call it together): vocab-parallel ones
        are gathered across ranks; used by the engine's accept-length probe."""
        t = self.get_parameter(name).data
        # Gloo gathers no bfloat16: the bytes travel as uint8.
        return self.tp.all_gather_cat(t.view(torch.uint8), dim=0).view(t.dtype)

    def hf_tensors(self):
        """Every full HF tensor rebuilt from the shards (all ranks call it together): the
        inverse of load_weights, for checksums recomputed from what the engine really holds."""
        tp, out = self.tp, {}
        gather = lambda t, dim: tp.all_gather_cat(t.contiguous().view(torch.uint8), dim).view(
            t.dtype
        )  # noqa: E731
        gather_list = lambda t: [
            x.view(t.dtype) for x in tp.all_gather_list(t.contiguous().view(torch.uint8))
        ]  # noqa: E731
        out["model.embed_tokens.weight"] = gather(self.model.embed_tokens.weight.data, 0)
        for i, layer in enumerate(self.model.layers):
            p = f"model.layers.{i}."
            q, kv = layer.heads * layer.hd, layer.kv_heads * layer.hd
            qkv = layer.self_attn.qkv_proj.weight.data
            for name, part in zip("qkv", qkv.split([q, kv, kv], dim=0)):
                full = gather(part, 0)
                if name != "q" and layer.kv_total < tp.size:  # one copy of each shared head
                    step = tp.size // layer.kv_total
                    full = full.view(tp.size, layer.hd, -1)[::step].reshape(-1, full.shape[-1])
                out[p + f"self_attn.{name}_proj.weight"] = full
            out[p + "self_attn.o_proj.weight"] = gather(layer.self_attn.o_proj.weight.data, 1)
            if layer.moe:
                out.update(layer.mlp.hf_tensors(p + "mlp.", gather_list))
            else:
                gate, up = layer.mlp.gate_up_proj.weight.data.chunk(2, dim=0)
                out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gather(gate, 0), gather(
                    up, 0
                )
                out[p + "mlp.down_proj.weight"] = gather(layer.mlp.down_proj.weight.data, 1)
            out[p + "input_layernorm.weight"] = layer.input_layernorm.weight.data
            out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.data
        out["model.norm.weight"] = self.model.norm.weight.data
        out["lm_head.weight"] = gather(self.lm_head.weight.data, 0)
        return out

    @torch.no_grad()
    def generate(self, ids, max_new_tokens, adapter=None):
        """Greedy decoding; with `adapter` (reference/lora.AdapterShards) W + s * B @ A in every
        adapted layer, the adapter taken once for the whole request."""
        deltas = adapter.deltas(self) if adapter is not None else None
        ids = torch.tensor(ids, dtype=torch.long)
        for _ in range(max_new_tokens):
            nxt = self.logits(self.hidden(ids, deltas)[-1:]).argmax(-1)
            ids = torch.cat([ids, nxt])
        return ids.tolist()


class DraftModel(torch.nn.Module):
    """The EAGLE-style draft, replicated on every rank. Post-load processing shuffles its
    weights in place with weightcast's tiled layout; its forward reads them unshuffled."""

    LAYOUT = "shuffle"

    def __init__(self, spec, dtype=torch.bfloat16):
        super().__init__()
        h = spec["hidden_size"]
        self.spec = spec
        self.draft = torch.nn.Module()
        self.draft.fc = torch.nn.Module()
        self.draft.fc.weight = torch.nn.Parameter(torch.zeros(h, 2 * h, dtype=dtype), requires_grad=False)
        self.draft.layers = torch.nn.ModuleList([Layer(spec, Parallel(), dtype)])
        self.draft.norm = torch.nn.Module()
        self.draft.norm.weight = torch.nn.Parameter(torch.zeros(h, dtype=dtype), requires_grad=False)
        self.processed = 0  # post-load processing runs, for the engine's report

    def load_weights(self, weights):
        loaded = []
        for name, full in weights:
            if name.startswith("draft.layers.0."):
                self.draft.layers[0].weight_loader(name[len("draft.layers.0.") :], full)
            else:
                self.get_parameter(name).data.copy_(full)
            loaded.append(name)
        return loaded

    def _layout(self, tensor, undo):
        raw = tensor.view(-1).view(torch.uint8).numpy()
        _weightcast._layout_in_place(
            self.LAYOUT, undo, str(tensor.dtype).replace("torch.", ""), list(tensor.shape), raw
        )

    def process_weights_after_loading(self):
        """The non-idempotent post-processing: every draft matrix into the tiled layout."""
        for p in self.parameters():
            if p.dim() == 2:
                self._layout(p.data, undo=False)
        self.processed += 1

    def hf_tensors(self):
        """The draft's full tensors as loaded (layouts undone), keyed by HF name."""
        out = {}
        for name, _ in self.named_parameters():
            hf = name.replace("self_attn.qkv_proj", "QKV").replace("mlp.gate_up_proj", "GATEUP")
            t = self.logical(name)
            if "QKV" in hf:
                layer = self.draft.layers[0]
                q, kv = layer.heads * layer.hd, layer.kv_heads * layer.hd
                for n, part in zip("qkv", t.split([q, kv, kv], dim=0)):
                    out[hf.replace("QKV", f"self_attn.{n}_proj")] = part
            elif "GATEUP" in hf:
                gate, up = t.chunk(2, dim=0)
                out[hf.replace("GATEUP", "mlp.gate_proj")], out[hf.replace("GATEUP", "mlp.up_proj")] = (
                    gate,
                    up,
                )
            else:
                out[hf] = t
        return out

    def logical(self, name):
        """A parameter as the draft's kernels read it: its layout undone, in a copy."""
        t = self.get_parameter(name).data.clone()
        if t.dim() == 2:
            self._layout(t, undo=True)
        return t
