"""A torch trainer pushing its weights to rollout engines after every optimizer step.

    build/launcher/engine/weightcast-engine --port 30000 --draft &
    build/launcher/engine/weightcast-engine --port 30001 --draft --ranks 2 &
    PYTHONPATH=build/python python3 examples/python/update_from_torch.py \\
        http://127.0.0.1:30000 http://127.0.0.1:30001

Expected output (timings vary):
    selector target
    step 1 loss 7.1399 version 1 selector target tensors 6 bytes 1573888 buckets 1 seconds 0.016 GB/s 0.099 verified
    step 2 loss 7.0956 version 2 selector target tensors 6 bytes 1573888 buckets 1 seconds 0.008 GB/s 0.186 verified
    step 3 loss 7.0560 version 3 selector target tensors 6 bytes 1573888 buckets 1 seconds 0.017 GB/s 0.095 verified
"""

import argparse

import torch

import weightcast


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=1024, hidden=256):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.up_proj = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        self.down_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.norm = torch.nn.LayerNorm(hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed_tokens(tokens)
        h = h + self.down_proj(torch.relu(self.up_proj(h)))
        return self.lm_head(self.norm(h))


def hf_names(model):
    """(engine name, tensor) pairs in bfloat16, as a rollout engine would load them."""
    for name, param in model.state_dict().items():
        hf = name if name.startswith("lm_head") else "model." + name
        yield hf, param.to(torch.bfloat16)  # a fresh tensor, held by update() while it runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engines", nargs="+", help="engine URLs")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # The engines run EAGLE with a frozen draft: only the target may be touched.
    selector = weightcast.weight_update_selector(speculative_algorithm="EAGLE", mtp_num_layers=0)
    print("selector", selector)
    with weightcast.DistributedUpdater(engines=args.engines, selector=selector, verify=True) as updater:
        for step in range(1, args.steps + 1):
            tokens = torch.randint(0, 1024, (8, 32))
            loss = torch.nn.functional.cross_entropy(
                model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            report = updater.update(hf_names(model))  # raises on failure; engines roll back
            print(
                f"step {step} loss {loss.item():.4f} {report}",
                "verified" if report.verified else "NOT verified",
                flush=True,
            )


if __name__ == "__main__":
    main()
