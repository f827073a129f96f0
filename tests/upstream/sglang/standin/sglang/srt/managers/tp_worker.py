"""Stand-in of sgl-project/sglang python/sglang/srt/managers/tp_worker.py (``TpModelWorker``).

Reproduced: ``model_runner``; ``init_weights_update_group(recv_req)`` and
``destroy_weights_update_group(recv_req)`` answering (success, message), handing the request's
fields to the model runner (main: to ``model_runner.weight_updater``, with the external
receiver's fields where the build has them); ``update_weights_from_distributed(recv_req)`` only
in v0.5.x (PR #28575 removed the per-worker update on main); ``iter_runners()`` yielding
(role, ModelRunner), role "" for the target. sglang-miles LoRA (@a0e1292f):
``load_lora_adapter_from_distributed(recv_req)`` hands the request's fields to the model runner;
``load_lora_adapter_from_tensors(recv_req)`` reads entry ``tp_rank`` of
``serialized_named_tensors`` (upstream: MultiprocessingSerializer; here plain pickle in base64, a
dict of name -> tensor, or a flattened bucket with load_format "flattened_bucket"; the
``expected_checksums`` comparison is left out) and hands the tensors on;
``unload_lora_adapter(recv_req)`` passes the request's ref. v0.5.x only:
``update_weights_from_tensor(recv_req)`` reads entry ``tp_rank`` of ``serialized_named_tensors``
(as above) and hands the tensors and ``load_format`` to ``model_runner.update_weights_from_tensor``,
answering its (success, message) (the shape read at tp_worker.py @4f34e24a). The speculative draft worker is the same shape with
its runners' role "draft" (sglang/srt/speculative's EAGLE worker).
"""

from sglang.cells import CELL


class TpModelWorker:
    def __init__(self, model_runner, role=""):
        self.model_runner, self.role = model_runner, role

    def iter_runners(self):
        return [(self.role, self.model_runner)]

    def _groups(self):
        return self.model_runner.weight_updater if CELL.weight_updater else self.model_runner

    def init_weights_update_group(self, recv_req):
        extra = {}
        if CELL.external_receivers:
            extra = {"receiver": recv_req.receiver, "receiver_init_payload": recv_req.receiver_init_payload}
        return self._groups().init_weights_update_group(
            recv_req.master_address,
            recv_req.master_port,
            recv_req.rank_offset,
            recv_req.world_size,
            recv_req.group_name,
            recv_req.backend,
            **extra
        )

    def destroy_weights_update_group(self, recv_req):
        return self._groups().destroy_weights_update_group(recv_req.group_name)


def _update_weights_from_distributed(self, recv_req):
    return self.model_runner.update_weights_from_distributed(
        recv_req.names, recv_req.dtypes, recv_req.shapes, recv_req.group_name, recv_req.load_format
    )


def _update_weights_from_tensor(self, recv_req):
    from sglang.srt.utils import deserialize_named_tensors

    named = deserialize_named_tensors(
        recv_req.serialized_named_tensors, self.model_runner.tp_rank, recv_req.load_format
    )
    return self.model_runner.update_weights_from_tensor(named_tensors=named, load_format=recv_req.load_format)


if CELL.per_worker_update:
    TpModelWorker.update_weights_from_distributed = _update_weights_from_distributed
    TpModelWorker.update_weights_from_tensor = _update_weights_from_tensor


def _load_lora_adapter_from_distributed(self, recv_req):
    return self.model_runner.load_lora_adapter_from_distributed(
        recv_req.to_ref(),
        recv_req.names,
        recv_req.dtypes,
        recv_req.shapes,
        recv_req.config_dict,
        recv_req.group_name,
        recv_req.added_tokens_config,
        upsert=recv_req.upsert,
    )


def _load_lora_adapter_from_tensors(self, recv_req):
    from sglang.srt.utils import deserialize_named_tensors

    tensors = dict(
        deserialize_named_tensors(
            recv_req.serialized_named_tensors, self.model_runner.tp_rank, recv_req.load_format
        )
    )
    return self.model_runner.load_lora_adapter_from_tensors(
        recv_req.to_ref(), tensors, recv_req.config_dict, recv_req.added_tokens_config, upsert=recv_req.upsert
    )


def _unload_lora_adapter(self, recv_req):
    return self.model_runner.unload_lora_adapter(recv_req.to_ref())


if CELL.lora:
    TpModelWorker.load_lora_adapter_from_distributed = _load_lora_adapter_from_distributed
    TpModelWorker.load_lora_adapter_from_tensors = _load_lora_adapter_from_tensors
    TpModelWorker.unload_lora_adapter = _unload_lora_adapter
