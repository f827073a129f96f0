"""Stand-in of sgl-project/sglang python/sglang/srt/managers/scheduler_components/
weight_updater.py (``SchedulerWeightUpdaterManager``), present from sglang-miles v0.5.16 on.

Reproduced from @00a2ca2e (main) and the earlier stored version that receives through
``model_runner.receive_weights_from_distributed`` (taken here as sglang-miles v0.5.16):
init/destroy go to the target worker; ``begin_weight_update(recv_req)`` asserts no session is
open ("begin_weight_update called while a weight-update session is already open"), records the
selector, calls ``begin_weight_update()`` on each selected runner (target first); every
``update_weights_from_distributed`` asserts an open session ("... requires an open
begin_weight_update session"), receives once through the target runner (main: its
weight_updater; the external-receiver build passes keywords and ``receiver_payload``), loads the
result into each selected runner, and answers success false with SGLang's "partially updated"
message when that raises; ``end_weight_update`` asserts an open session and calls
``end_weight_update(run_post_load=...)`` on the runners of the recorded selector. The selector
parser refuses anything but target, draft, all. ``update_weights_from_tensor`` (@00a2ca2e, taken for
every manager cell) asserts an open session, deserializes entry ``tp_rank`` of
``serialized_named_tensors`` (upstream: MultiprocessingSerializer, ForkingPickler's pickle; here
plain pickle), reconstructs a flattened bucket, and loads it into each selected runner. (The TP CPU-group barriers are left out: the
stand-in's TP workers share no torch group.)
"""

from dataclasses import dataclass
from typing import Any, Callable, Optional

from sglang.cells import CELL, require
from sglang.srt.managers import io_struct as io
from sglang.srt.utils import deserialize_named_tensors

require(CELL.manager, __name__)


def _parse_runner_selector(selector):
    if selector == "all":
        return {"target", "draft"}
    if selector in ("target", "draft"):
        return {selector}
    raise ValueError(f"invalid selector {selector!r}; expected 'target', 'draft', or 'all'")


@dataclass(kw_only=True, slots=True)
class SchedulerWeightUpdaterManager:
    tp_worker: Any
    draft_worker: Any
    record_weight_version: Callable[[Optional[str]], None]
    _weight_update_in_progress: bool = False
    _weight_update_loaded: bool = False
    _weight_update_selector: str = "all"

    def init_weights_update_group(self, recv_req):
        success, message = self.tp_worker.init_weights_update_group(recv_req)
        return io.InitWeightsUpdateGroupReqOutput(success=success, message=message)

    def destroy_weights_update_group(self, recv_req):
        success, message = self.tp_worker.destroy_weights_update_group(recv_req)
        return io.DestroyWeightsUpdateGroupReqOutput(success=success, message=message)

    def iter_weight_update_workers(self, selector="all"):
        parsed = _parse_runner_selector(selector)
        workers = []
        if "target" in parsed:
            workers.append(("target", self.tp_worker))
        if "draft" in parsed and self.draft_worker is not None:
            workers.append(("draft", self.draft_worker))
        return workers

    def get_model_runners(self, selector="all"):
        runners = []
        for _, worker in self.iter_weight_update_workers(selector):
            runners += worker.iter_runners()
        return runners

    def _receive(self, recv_req):
        runner = self.tp_worker.model_runner
        if CELL.external_receivers:
            return runner.weight_updater.receive_weights_from_distributed(
                names=recv_req.names,
                dtypes=recv_req.dtypes,
                shapes=recv_req.shapes,
                group_name=recv_req.group_name,
                load_format=recv_req.load_format,
                receiver_payload=recv_req.receiver_payload,
            )
        source = runner.weight_updater if CELL.weight_updater else runner
        return source.receive_weights_from_distributed(
            recv_req.names, recv_req.dtypes, recv_req.shapes, recv_req.group_name, recv_req.load_format
        )

    def update_weights_from_distributed(self, recv_req):
        assert (
            self._weight_update_in_progress
        ), "update_weights_from_distributed requires an open begin_weight_update session"
        try:
            weights = self._receive(recv_req)
            for _, runner in self.get_model_runners(recv_req.selector):
                (runner.weight_updater if CELL.weight_updater else runner).load_weights(weights)
            success, message = True, "Succeeded to update parameter online."
        except Exception as e:
            success = False
            message = (
                f"Failed to update parameter online: {e}. The full weights of the ModelRunner are "
                "partially updated. Please discard the whole weights."
            )
        if success:
            self._weight_update_loaded = True
            self.record_weight_version(recv_req.weight_version)
        return io.UpdateWeightsFromDistributedReqOutput(success=success, message=message)

    def update_weights_from_tensor(self, recv_req):
        assert (
            self._weight_update_in_progress
        ), "update_weights_from_tensor requires an open begin_weight_update session"
        named_tensors = deserialize_named_tensors(
            recv_req.serialized_named_tensors, self.tp_worker.model_runner.tp_rank, recv_req.load_format
        )
        success, message = True, "Success"
        try:
            for _, runner in self.get_model_runners(recv_req.selector):
                (runner.weight_updater if CELL.weight_updater else runner).load_weights(named_tensors)
        except Exception as e:
            success, message = False, f"Failed to update weights from tensor: {e}"
        if success:
            self._weight_update_loaded = True
            self.record_weight_version_after_update(recv_req.weight_version)
        return io.UpdateWeightsFromTensorReqOutput(success=success, message=message)

    def record_weight_version_after_update(self, weight_version):
        self.record_weight_version(weight_version)

    def begin_weight_update(self, recv_req):
        assert (
            not self._weight_update_in_progress
        ), "begin_weight_update called while a weight-update session is already open"
        self._weight_update_selector = recv_req.selector
        for _, runner in self.get_model_runners(recv_req.selector):
            runner.begin_weight_update()
        self._weight_update_in_progress = True
        self._weight_update_loaded = False
        return io.BeginWeightUpdateReqOutput(success=True, message="Success")

    def end_weight_update(self, recv_req):
        assert self._weight_update_in_progress, "end_weight_update called without begin_weight_update"
        run_post_load = not self._weight_update_loaded
        for _, runner in self.get_model_runners(self._weight_update_selector):
            runner.end_weight_update(run_post_load=run_post_load)
        self._weight_update_in_progress = False
        return io.EndWeightUpdateReqOutput(success=True, message="Success")
