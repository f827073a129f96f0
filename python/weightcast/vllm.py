"""weightcast inside vLLM: a weight-transfer backend named ``weightcast`` and a worker extension.

Targets vLLM's pluggable weight-transfer API (``vllm/distributed/weight_transfer/``, vLLM >= 0.16;
written against the upstream main branch of 2026-12, whose ``WeightTransferEngine.__init__`` takes
``(config, vllm_config, device, model)``). Neither vLLM nor a GPU is available where this was
written: scripts/gpu-check.sh imports and exercises this module wherever vLLM imports.

1. Backend (every worker process registers it through the ``vllm.general_plugins`` entry point
   ``weightcast = weightcast.vllm:register`` in the package metadata)::

       vllm serve MODEL --weight-transfer-config '{"backend": "weightcast"}'

   ``/init_weight_transfer_engine {"init_info": <init_weights_update_group body>}``,
   ``/start_weight_update``, ``/update_weights {"update_info": <update_weights_from_distributed
   body>}`` (one per bucket; ``{"abort": true}`` aborts), ``/finish_weight_update`` map onto the
   Receiver's join, begin, receive and commit: buckets are staged and verified, and
   ``load_weights`` runs at finish. weightcast-train speaks these routes itself (engine flavor
   ``vllm``, detected from ``/server_info``); the dicts are read by
   ``weightcast.engine_rank.parse_init_info`` / ``parse_update_info``, the same functions the
   torch reference engine's ``--api vllm`` routes use.

2. Worker extension, for builds without custom backends::

       vllm serve MODEL --worker-extension-cls weightcast.vllm.WeightcastWorkerExtension

   then ``collective_rpc("weightcast_init", args=(body,))``, ``weightcast_begin``,
   ``weightcast_update``, ``weightcast_commit``, ``weightcast_abort``, ``weightcast_destroy``
   (every method is prefixed: newer workers define ``update_weights`` themselves).
"""

from .engine_rank import EngineRank, parse_init_info, parse_update_info

BACKEND = "weightcast"


def register():
    """vllm.general_plugins entry point: runs in every vLLM process."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "WeightcastTransferEngine")
    except ValueError:  # already registered in this process
        pass


def _tp_place(parallel_config, device):
    """Each worker joins as its TP rank; PP stages would collide on ranks (the trainer refuses
    such engines too: sync/trainer/vllm_client.h)."""
    from vllm.distributed import get_tensor_model_parallel_rank

    if getattr(parallel_config, "pipeline_parallel_size", 1) != 1:
        raise ValueError("weightcast: the backend receives on TP-only engines (pipeline_parallel_size 1)")

    return {"engine_rank": get_tensor_model_parallel_rank(),
            "rank_count": parallel_config.tensor_parallel_size,
            "device": device.index if getattr(device, "type", "cpu") == "cuda" else None}


def _make_engine_class():
    from dataclasses import dataclass, field

    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    @dataclass
    class WeightcastInitInfo:
        body: dict = field(default_factory=dict)      # the init_weights_update_group body
        options: dict = field(default_factory=dict)   # keep_delta_base

    @dataclass
    class WeightcastUpdateInfo:
        info: dict = field(default_factory=dict)      # the update_info dict, parsed in the rank

    class WeightcastTransferEngine(WeightTransferEngine):
        init_info_cls = WeightcastInitInfo
        update_info_cls = WeightcastUpdateInfo

        def __init__(self, config, vllm_config, device, model):
            super().__init__(config, vllm_config, device, model)
            self.rank = None

        def parse_init_info(self, init_dict):
            return WeightcastInitInfo(*parse_init_info(init_dict))

        def parse_update_info(self, update_dict):
            parse_update_info(update_dict)  # fails here, naming the field, before any receive
            return WeightcastUpdateInfo(dict(update_dict))

        def init_transfer_engine(self, init_info):
            self.rank = EngineRank(self.model, keep_delta_base=init_info.options["keep_delta_base"],
                                   **_tp_place(self.parallel_config, self.device))
            self.rank.init_group(init_info.body)

        def start_weight_update(self):
            self.rank.vllm_start()

        def receive_weights(self, update_info):
            self.rank.vllm_update(update_info.info)

        def finish_weight_update(self):
            self.rank.vllm_finish()

        def shutdown(self):
            if self.rank is not None:
                for group in self.rank.receiver.groups:
                    self.rank.destroy_group(group)

    return WeightcastTransferEngine


def __getattr__(name):
    # Built on first use, so importing weightcast.vllm never imports vLLM.
    if name == "WeightcastTransferEngine":
        cls = _make_engine_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


class WeightcastWorkerExtension:
    """Mixin appended to vLLM's worker class (--worker-extension-cls); runs in every worker with
    ``self.model_runner.model`` and ``self.device``."""

    def weightcast_init(self, body, keep_delta_base=False):
        self._weightcast = EngineRank(self.model_runner.model, keep_delta_base=keep_delta_base,
                                      **_tp_place(self.vllm_config.parallel_config, self.device))
        return self._weightcast.init_group(body)

    def weightcast_begin(self, selector="all"):
        return self._weightcast.begin(selector)

    def weightcast_update(self, body):
        return self._weightcast.update(body)

    def weightcast_commit(self, version=None):
        return self._weightcast.end(version)

    def weightcast_abort(self, reason="aborted"):
        return self._weightcast.abort(reason)

    def weightcast_destroy(self, group_name="weight_update_group"):
        return self._weightcast.destroy_group(group_name)
