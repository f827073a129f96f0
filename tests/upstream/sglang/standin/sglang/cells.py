"""The matrix cells: which upstream shape each stand-in module takes (SGLANG_STANDIN_CELL).

- v0.5-dataclass: SGLang v0.5.x before the msgspec migration (io_struct dataclasses; per-worker
  TpModelWorker.update_weights_from_distributed; no begin/end sessions, no selector).
- miles-v0.5.16: the sglang-miles branch Miles pins (v0.5.16): msgspec request structs,
  SchedulerWeightUpdaterManager with begin/end sessions and selectors, the manager receiving
  through ModelRunner.receive_weights_from_distributed and loading each selected runner.
- main-weight-updater: sgl-project/sglang main after PR #28575: per-worker updates removed, the
  manager receiving through model_runner.weight_updater; get_internal_state on
  SchedulerInternalStateController.
- main-external-receivers: the same plus sglang/srt/weight_sync/external_receiver.py
  (--weight-update-receivers).
"""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    name: str
    version: str
    msgspec: bool
    per_worker_update: bool
    manager: bool
    weight_updater: bool
    external_receivers: bool
    state_controller: bool


CELLS = {
    "v0.5-dataclass": Cell("v0.5-dataclass", "0.5.9", False, True, False, False, False, False),
    "miles-v0.5.16": Cell("miles-v0.5.16", "0.5.16", True, False, True, False, False, False),
    "main-weight-updater": Cell("main-weight-updater", "0.5.17.dev0", True, False, True, True, False, True),
    "main-external-receivers": Cell(
        "main-external-receivers", "0.5.17.dev1", True, False, True, True, True, True
    ),
}

_name = os.environ.get("SGLANG_STANDIN_CELL", "")
if _name not in CELLS:
    raise RuntimeError(f"SGLANG_STANDIN_CELL must be one of {sorted(CELLS)} (got {_name!r})")
CELL = CELLS[_name]


def require(flag, module):
    """Makes `module` absent (ModuleNotFoundError, as for a file the version lacks)."""
    if not flag:
        raise ModuleNotFoundError(
            f"No module named '{module}' (SGLang {CELL.version}, cell {CELL.name})", name=module
        )
