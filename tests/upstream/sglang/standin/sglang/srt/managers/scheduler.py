"""Stand-in of sgl-project/sglang python/sglang/srt/managers/scheduler.py: one TP rank's
scheduler, dispatching the weight-update requests the way each version does.

v0.5.x: the scheduler itself calls ``tp_worker.init/update/destroy`` (update: the per-worker
``update_weights_from_distributed`` or ``update_weights_from_tensor``, then records the version). sglang-miles v0.5.16 and main:
the ``SchedulerWeightUpdaterManager`` answers them and begin/end. ``get_internal_state`` is a
Scheduler method before main, ``SchedulerInternalStateController``'s on main. An exception out
of a handler (the manager's session asserts) ends the scheduler, as it does SGLang's event loop.
"""

from sglang.cells import CELL
from sglang.srt.managers import io_struct as io


class Scheduler:
    def __init__(self, tp_worker, draft_worker=None):
        self.tp_worker, self.draft_worker = tp_worker, draft_worker
        self.weight_version = None
        if CELL.manager:
            from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager

            self.weight_updater_manager = SchedulerWeightUpdaterManager(
                tp_worker=tp_worker, draft_worker=draft_worker, record_weight_version=self._record
            )
        if CELL.state_controller:
            from sglang.srt.managers.scheduler_components.internal_state import (
                SchedulerInternalStateController,
            )

            self.internal_state_controller = SchedulerInternalStateController(self)

    def _record(self, version):
        if version is not None:
            self.weight_version = version

    def base_internal_state(self):
        return {"last_gen_throughput": 0.0, "weight_version": self.weight_version}

    def handle(self, req):
        kind = type(req).__name__
        if kind == "GetInternalStateReq":
            if CELL.state_controller:
                return self.internal_state_controller.get_internal_state(req)
            return self.get_internal_state(req)
        if kind in ("LoadLoRAAdapterFromDistributedReqInput", "LoadLoRAAdapterFromTensorsReqInput"):
            # sglang-miles @a0e1292f: the scheduler hands LoRA requests to the target worker.
            method = "load_lora_adapter_from_" + ("distributed" if "Distributed" in kind else "tensors")
            return getattr(self.tp_worker, method)(req)
        if kind == "UnloadLoRAAdapterReqInput":
            return self.tp_worker.unload_lora_adapter(req)
        if CELL.manager:
            method = {
                "InitWeightsUpdateGroupReqInput": "init_weights_update_group",
                "DestroyWeightsUpdateGroupReqInput": "destroy_weights_update_group",
                "UpdateWeightsFromDistributedReqInput": "update_weights_from_distributed",
                "BeginWeightUpdateReqInput": "begin_weight_update",
                "EndWeightUpdateReqInput": "end_weight_update",
                "UpdateWeightsFromTensorReqInput": "update_weights_from_tensor",
            }[kind]
            return getattr(self.weight_updater_manager, method)(req)
        if kind == "InitWeightsUpdateGroupReqInput":
            return io.InitWeightsUpdateGroupReqOutput(
                **_answer(self.tp_worker.init_weights_update_group(req))
            )
        if kind == "DestroyWeightsUpdateGroupReqInput":
            return io.DestroyWeightsUpdateGroupReqOutput(
                **_answer(self.tp_worker.destroy_weights_update_group(req))
            )
        if kind == "UpdateWeightsFromDistributedReqInput":
            success, message = self.tp_worker.update_weights_from_distributed(req)
            if success:
                self._record(req.weight_version)
            return io.UpdateWeightsFromDistributedReqOutput(success=success, message=message)
        if kind == "UpdateWeightsFromTensorReqInput":  # v0.5.x: the worker loads the target
            success, message = self.tp_worker.update_weights_from_tensor(req)
            if success:
                self._record(req.weight_version)
            return io.UpdateWeightsFromTensorReqOutput(success=success, message=message)
        raise ValueError(f"no handler for {kind}")


def _answer(pair):
    return {"success": pair[0], "message": pair[1]}


def _get_internal_state(self, recv_req):
    return io.GetInternalStateReqOutput(internal_state=self.base_internal_state())


if not CELL.state_controller:
    Scheduler.get_internal_state = _get_internal_state
