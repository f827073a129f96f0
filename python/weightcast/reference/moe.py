"""The reference model's mixture-of-experts MLP, with expert parallelism.

The experts are split over ``ep`` expert-parallel ranks, as the C++ rules place them
(sync/model/expert_placement.h, linear: EP rank p holds experts [p * E/ep, (p + 1) * E/ep)). EP
rank p spans TP ranks [p * tp/ep, (p + 1) * tp/ep), and each of its experts is split over those
ranks as a dense MLP is: gate/up by rows, down by columns. A rank holds nothing of the other
experts: ``weight_loader`` reads nothing of them (a recorded plan says "absent"), and a rank
receiving them anyway (a trainer that does not shard) drops them.

The router (``mlp.gate.weight``) is replicated. Each token goes to its ``num_experts_per_tok`` (2
unless the config says) most likely experts, weighted by their renormalized softmax. Every rank
adds up what its own experts make of the tokens routed to them, and the TP all-reduce sums the
ranks: the same output as one process holding every expert, in float64. Shared experts are not
modelled.
"""

import torch


class MoeMlp(torch.nn.Module):
    """One layer's router and this rank's experts (``experts.<global index>``)."""

    def __init__(self, spec, tp, dtype):
        super().__init__()
        experts, ep = spec["num_experts"], getattr(tp, "ep", 1)
        if spec.get("shared_expert_intermediate_size"):
            raise ValueError("the reference model does not model shared experts")
        if tp.size % ep or experts % ep:
            raise ValueError(f"EP {ep} must divide TP {tp.size} and the {experts} experts")
        self.group = tp.size // ep  # TP ranks per EP rank
        self.part = tp.rank % self.group  # this rank's part of each expert it holds
        per = experts // ep
        first = tp.rank // self.group * per
        self.held = range(first, first + per)
        self.tp, self.top_k = tp, spec.get("num_experts_per_tok") or 2
        ff, h = spec["moe_intermediate_size"] // self.group, spec["hidden_size"]
        p = lambda *shape: torch.nn.Parameter(
            torch.zeros(*shape, dtype=dtype), requires_grad=False
        )  # noqa: E731
        self.gate = torch.nn.Module()
        self.gate.weight = p(experts, h)
        self.experts = torch.nn.ModuleDict()
        for e in self.held:
            m = torch.nn.Module()
            m.gate_up_proj = torch.nn.Module()
            m.gate_up_proj.weight = p(2 * ff, h)
            m.down_proj = torch.nn.Module()
            m.down_proj.weight = p(h, ff)
            self.experts[str(e)] = m

    def weight_loader(self, suffix, full):
        """Loads HF weight `suffix` (under ``mlp.``) in place: the router whole; an expert this
        rank holds narrowed into its part; any other expert not at all."""
        if suffix == "gate.weight":
            self.gate.weight.data.copy_(full)
            return
        _, index, proj, _ = suffix.split(".")  # experts.<e>.<proj>.weight
        if int(index) not in self.held:
            return
        expert = self.experts[index]
        if proj == "down_proj":
            expert.down_proj.weight.data.copy_(self._narrow(full, 1))
            return
        rows = expert.gate_up_proj.weight.shape[0] // 2
        start = {"gate_proj": 0, "up_proj": rows}[proj]
        expert.gate_up_proj.weight.data.narrow(0, start, rows).copy_(self._narrow(full, 0))

    def _narrow(self, full, dim):
        if self.group == 1:
            return full
        size = full.shape[dim] // self.group
        return full.narrow(dim, self.part * size, size)

    def forward(self, h):
        f = torch.float64
        weights, chosen = (h @ self.gate.weight.to(f).t()).softmax(-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e in self.held:
            w = (weights * (chosen == e)).sum(-1)
            rows = w.nonzero().flatten()
            if rows.numel() == 0:
                continue
            expert, x = self.experts[str(e)], h[rows]
            gate, up = (x @ expert.gate_up_proj.weight.to(f).t()).chunk(2, dim=-1)
            y = (torch.nn.functional.silu(gate) * up) @ expert.down_proj.weight.to(f).t()
            out[rows] += w[rows, None] * y
        return self.tp.all_reduce(out)

    def hf_tensors(self, prefix, gather_list):
        """{HF name: full tensor} of the router and every expert, rebuilt from the ranks' parts
        (all ranks call it together); `gather_list(t)` gathers `t` from every TP rank, in rank
        order."""
        out = {prefix + "gate.weight": self.gate.weight.data}
        per = len(self.held)
        for j in range(per):  # every rank's j-th expert at once
            mine = self.experts[str(self.held[j])]
            gate_up = gather_list(mine.gate_up_proj.weight.data)
            down = gather_list(mine.down_proj.weight.data)
            for ep_rank in range(len(gate_up) // self.group):
                ranks = range(ep_rank * self.group, (ep_rank + 1) * self.group)
                name = f"{prefix}experts.{ep_rank * per + j}."
                halves = [gate_up[r].chunk(2, dim=0) for r in ranks]
                out[name + "gate_proj.weight"] = torch.cat([g for g, _ in halves], dim=0)
                out[name + "up_proj.weight"] = torch.cat([u for _, u in halves], dim=0)
                out[name + "down_proj.weight"] = torch.cat([down[r] for r in ranks], dim=1)
        return out
