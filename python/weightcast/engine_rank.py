"""The shared core of the vLLM and SGLang plug-ins: one engine rank's Receiver over a model that
takes ``load_weights(iterable of (hf_name, full tensor))``, driven with the control plane's JSON
bodies. The plug-ins (weightcast.vllm, weightcast.sglang) only translate their engine's calls
into these; the torch reference engine (weightcast.torch_engine) runs the same Receiver, which is
how this core is tested where neither engine can be installed.

Session rule for clients that send no begin/end (plain SGLang clients, slime): each bucket
request is then its own session (staged, verified, committed), so a failed bucket still leaves
the model on complete previous tensors, never a half-written bucket.
"""

import json

from .receiver import Receiver, load_weights_runner


class EngineRank:
    def __init__(self, model=None, *, engine_rank, rank_count, device=None, keep_delta_base=False,
                 finish=None, runners=None, **receiver_options):
        """`model` (one "target" runner over model.load_weights) or explicit `runners`."""
        if runners is None:
            runners = [load_weights_runner(model, finish=finish)]
        self.receiver = Receiver(runners, engine_rank=engine_rank, rank_count=rank_count, device=device,
                                 keep_delta_base=keep_delta_base, **receiver_options)
        self.engine_rank = engine_rank
        self.explicit_session = False

    def init_group(self, body):
        body = json.loads(body) if isinstance(body, str) else body
        self.receiver.join(body)
        return True, f"joined group '{body.get('group_name', 'weight_update_group')}' as group rank " \
                     f"{int(body.get('rank_offset', 0)) + self.engine_rank}"

    def destroy_group(self, group_name="weight_update_group"):
        self.receiver.leave(group_name)
        return True, "left"

    def begin(self, selector="all"):
        answer = self.receiver.begin(selector)
        self.explicit_session = True
        return answer

    def update(self, body):
        """One bucket request; commits at once when no session was begun explicitly."""
        body = json.loads(body) if isinstance(body, str) else body
        implicit = not self.explicit_session
        if implicit and not self.receiver.in_session:
            self.receiver.begin(body.get("selector", "all"))
        try:
            size = self.receiver.receive(body)
        except Exception:
            if implicit:
                self.receiver.abort("bucket failed")
            raise
        if implicit:
            self.receiver.commit(body.get("weight_version"))
        return True, f"received {size} bytes"

    def end(self, version=None):
        self.explicit_session = False
        return self.receiver.commit(version)

    def abort(self, reason="aborted"):
        self.explicit_session = False
        self.receiver.abort(reason)
