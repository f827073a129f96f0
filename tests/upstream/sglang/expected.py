"""What the stand-in engine must hold, kept beside the rounds a cell sends: the full HF tensors that
should have landed per runner, and how often each runner should have begun a session and
post-processed. A check rebuilds each TP rank's shard (and the draft's post-processed layout) by
loading those tensors into a fresh reference model, and compares every parameter's bytes with
what the engine's ranks report (GET /stand_in/state)."""

import torch

from weightcast.reference.model import DraftModel, Parallel, TargetModel, model_spec
from weightcast import _weightcast


def initial(runner, seed):
    out = {}
    for name, dtype, shape, raw in _weightcast._model_tensors("tiny", runner, seed, 0):
        out[name] = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)
        )
    return out


def hexes(pairs):
    """{name: hex of the tensor's bytes} of (name, tensor) pairs: how the engine reports what it
    holds (GET /stand_in/state) and how the checks compare it."""
    return {n: t.data.contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex() for n, t in pairs}


class Expected:
    def __init__(self, tp, seed):
        self.tp, self.spec = tp, model_spec("tiny")
        self.tensors = {"target": initial("target", seed), "draft": initial("draft", seed)}
        self.counts = {
            "target": {"begun": 0, "post_processed": 0},
            "draft": {"begun": 0, "post_processed": 0},
        }

    def random(self, runner, gen):
        """New values for every tensor of `runner`, same names, dtypes and shapes."""
        return [
            (
                n,
                torch.randint(0, 1 << 15, t.shape, dtype=torch.int16, generator=gen).view(torch.bfloat16)
                if t.dtype == torch.bfloat16
                else torch.rand(t.shape, generator=gen).to(t.dtype),
            )
            for n, t in self.tensors[runner].items()
        ]

    def landed(self, runner, pairs):
        for name, t in pairs:
            self.tensors[runner][name] = t.clone()

    def session(self, selector):
        """SGLang's begin and end ran on the runners `selector` covers."""
        for runner in ["target", "draft"] if selector == "all" else [selector]:
            self.counts[runner]["begun"] += 1
            self.counts[runner]["post_processed"] += 1

    def _reference(self, rank):
        target = TargetModel(self.spec, Parallel(rank, self.tp))
        target.load_weights(iter(self.tensors["target"].items()))
        draft = DraftModel(self.spec)
        draft.load_weights(iter(self.tensors["draft"].items()))
        draft.process_weights_after_loading()  # the start-up post-processing; a session's end
        return {
            "target": hexes(target.named_parameters()),
            "draft": hexes(draft.named_parameters()),
        }  # re-does it after its begin undid it

    def mismatches(self, state):
        """Every difference between `state` (GET /stand_in/state) and what should be held."""
        out = []
        for rank, held in enumerate(state["ranks"]):
            want = self._reference(rank)
            for runner in ("target", "draft"):
                for name, data in want[runner].items():
                    if held["params"][runner].get(name) != data:
                        out.append(f"rank {rank} {runner} {name}: bytes differ")
                if held["runners"][runner] != self.counts[runner]:
                    out.append(
                        f"rank {rank} {runner}: began/post-processed {held['runners'][runner]}, "
                        f"expected {self.counts[runner]}"
                    )
        return out
