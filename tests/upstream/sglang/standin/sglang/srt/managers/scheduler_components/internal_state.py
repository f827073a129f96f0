"""Stand-in of sgl-project/sglang python/sglang/srt/managers/scheduler_components/internal_state.py
(``SchedulerInternalStateController`` @2784deee): ``get_internal_state(recv_req)`` answers
``GetInternalStateReqOutput(internal_state=<plain dict>)`` (upstream: msgspec_to_builtins of the
scheduler's state). Present on main only; before it Scheduler.get_internal_state answered."""

from sglang.cells import CELL, require
from sglang.srt.managers import io_struct as io

require(CELL.state_controller, __name__)


class SchedulerInternalStateController:
    def __init__(self, scheduler):
        self.scheduler = scheduler

    def get_internal_state(self, recv_req):
        return io.GetInternalStateReqOutput(internal_state=self.scheduler.base_internal_state())
