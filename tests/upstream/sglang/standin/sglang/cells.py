"""The matrix cells: which upstream shape each stand-in module takes (SGLANG_STANDIN_CELL).

- v0.5-dataclass: SGLang v0.5.x before the msgspec migration (io_struct dataclasses; per-worker
  TpModelWorker.update_weights_from_distributed; no begin/end sessions, no selector).
- miles-v0.5.16: the sglang-miles branch Miles pins (v0.5.16): msgspec request structs,
  SchedulerWeightUpdaterManager with begin/end sessions and selectors, the manager receiving
  through ModelRunner.receive_weights_from_distributed and loading each selected runner; and the
  branch's run-time LoRA routes (/load_lora_adapter_from_distributed with upsert,
  /load_lora_adapter_from_tensors with one entry per TP rank, /unload_lora_adapter), read at the
  sglang-miles merge a0e1292f (PR #30913). The main cells leave LoRA out: where main's distributed
  LoRA receive lives after PR #28575 was not read.
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
    lora: bool  # SGLang's run-time LoRA routes, the distributed one included (sglang-miles)


CELLS = {
    "v0.5-dataclass": Cell("v0.5-dataclass", "0.5.9", False, True, False, False, False, False, False),
    "miles-v0.5.16": Cell("miles-v0.5.16", "0.5.16", True, False, True, False, False, False, True),
    "main-weight-updater": Cell(
        "main-weight-updater", "0.5.17.dev0", True, False, True, True, False, True, False
    ),
    "main-external-receivers": Cell(
        "main-external-receivers", "0.5.17.dev1", True, False, True, True, True, True, False
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
