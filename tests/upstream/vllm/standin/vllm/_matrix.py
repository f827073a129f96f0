"""The versions the stand-ins reproduce, and what differs between them.

Facts and where they were read (upstream vllm-project/vllm):
  0.16.0  vllm/distributed/weight_transfer/base.py as of the v0.16.0 API docs and commit
          aa1cd966: WeightTransferEngine(config, parallel_config); abstract init_transfer_engine,
          receive_weights(update_info, load_weights), shutdown and the static trainer_send_weights;
          vllm/config/weight_transfer.py: backend Literal["nccl", "ipc"] (v0.16 docs). The worker
          owns start/finish (start_weight_update(is_checkpoint_format)), as the worker of that era
          does (mirrored by vllm-ascend's NPUWorker).
  0.25.0  base.py per the v0.25.0 docs ("Base Class and Custom Engines"): WeightTransferEngine(
          config, vllm_config, device, model); abstract init_transfer_engine,
          start_weight_update, finish_weight_update, receive_weights(update_info), shutdown and
          the static trainer_send_weights (abstract in base.py @02f250b0); update_weights(dict)
          in the base; backend a free string (from the 0.22.1/0.23 docs on). No draft retargeting
          (set_weight_update_target arrived with PR #46725, 2026-07-07), no /weight_info.
  main    base.py of upstream main (2026-12): five abstract methods (no trainer_send_weights: the
          trainer engine moved to TrainerWeightTransferEngine), supports_draft_weight_update,
          set/reset_weight_update_target, defers_processing; gpu_worker.py's
          _start_weight_update(is_draft); dev/rlhf/api_router.py @0100a212 (start routes ignore
          the body, finish records weight_version, /weight_info).
"""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Version:
    name: str
    free_backend: bool  # WeightTransferConfig.backend accepts any string
    engine_lifecycle: bool  # start/finish_weight_update are the engine's (abstract) methods
    new_constructor: bool  # (config, vllm_config, device, model), else (config, parallel_config)
    trainer_send_abstract: bool
    draft_target: bool  # set/reset_weight_update_target, /start_draft_weight_update
    weight_info: bool  # GET /weight_info, finish takes weight_version
    layerwise: bool  # model_loader.reload.initialize/finalize_layerwise_reload


VERSIONS = {
    "0.16.0": Version(
        "0.16.0",
        free_backend=False,
        engine_lifecycle=False,
        new_constructor=False,
        trainer_send_abstract=True,
        draft_target=False,
        weight_info=False,
        layerwise=True,
    ),
    "0.25.0": Version(
        "0.25.0",
        free_backend=True,
        engine_lifecycle=True,
        new_constructor=True,
        trainer_send_abstract=True,
        draft_target=False,
        weight_info=False,
        layerwise=True,
    ),
    "main": Version(
        "main",
        free_backend=True,
        engine_lifecycle=True,
        new_constructor=True,
        trainer_send_abstract=False,
        draft_target=True,
        weight_info=True,
        layerwise=True,
    ),
}

_name = os.environ.get("WEIGHTCAST_STANDIN_VLLM", "main")
if _name not in VERSIONS:
    raise ImportError(f"WEIGHTCAST_STANDIN_VLLM={_name!r}: one of {', '.join(VERSIONS)}")
VERSION = VERSIONS[_name]
