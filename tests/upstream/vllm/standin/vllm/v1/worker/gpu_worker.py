"""Stand-in of vllm/v1/worker/gpu_worker.py: the worker's weight-update state machine, per version
(_matrix.py), with upstream's refusals:
  - start while an update is active: RuntimeError "start_weight_update called while a weight
    update is already active. Call finish_weight_update first."
  - update_weights outside an update: "start_weight_update must be called before update_weights."
  - update_weights clears the active flag (and, on main, resets the engine's target) ONLY when the
    backend raises; a normal return leaves the update open.
  - finish without a start: "finish_weight_update called without a matching
    start_weight_update."; a finish whose backend raises leaves the update active.
  - main: start_draft_weight_update retargets the engine at model_runner.drafter.model
    (set_weight_update_target(model, draft_model_config)) and finish resets it; an engine with
    supports_draft_weight_update False is refused.
  - 0.16: the worker owns the lifecycle (start_weight_update(is_checkpoint_format) wraps the round
    in layerwise reload itself) and calls receive_weights(update_info, load_weights).
  - LoRA (@35d5cda123ec28581759b6d34cde8052314fb1e6): add_lora(lora_request) -> bool,
    remove_lora(lora_id) -> bool, list_loras() -> set, through the model runner's LoRA manager;
    "LoRA is not enabled. Use --enable-lora to enable LoRA." without one
    (lora_model_runner_mixin.py @8548e7c2d52a0987215d3abc808dbfac498f53e2).
Read at: main's gpu_worker.py (_start_weight_update(is_draft), 2026-12; see INTEROP §9) and the
0.16-era worker as vllm-ascend's NPUWorker mirrors it.
"""

import torch

from ... import distributed
from ..._matrix import VERSION
from ...distributed.weight_transfer.factory import WeightTransferEngineFactory


# The harness model's LoRA-capable modules (a Llama/Qwen decoder's packed q/k/v, o, gate/up, down).
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Worker:
    def __init__(self, vllm_config, rank, model_runner):
        self.vllm_config = vllm_config
        self.rank = self.local_rank = rank
        self.device = torch.device("cpu")
        self.model_runner = model_runner
        self._weight_update_active = False
        self._weight_update_is_draft = False
        self._is_checkpoint_format = True
        self.weight_transfer_engine = None
        distributed._tp_rank = rank
        if vllm_config.weight_transfer_config is not None:
            self.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
                vllm_config.weight_transfer_config, vllm_config, self.device, model_runner.model
            )

    def _lora_manager(self):
        if getattr(self, "_standin_lora", None) is None:
            config = getattr(self.vllm_config, "lora_config", None)
            if config is None:
                raise RuntimeError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
            from ...lora.worker_manager import LRUCacheWorkerLoRAManager

            self._standin_lora = LRUCacheWorkerLoRAManager(config.max_lora_rank, LORA_MODULES)
        return self._standin_lora

    def add_lora(self, lora_request):
        from ...lora.request import LoRARequest

        if isinstance(lora_request, dict):
            lora_request = LoRARequest(**lora_request)
        return self._lora_manager().add_adapter(lora_request)

    def remove_lora(self, lora_id):
        return self._lora_manager().remove_adapter(lora_id)

    def list_loras(self):
        return self._lora_manager().list_adapters()

    def _check_weight_transfer_engine(self):
        if self.weight_transfer_engine is None:
            raise RuntimeError(
                "Weight transfer not configured. "
                "Please set weight_transfer_config to enable weight transfer."
            )

    def init_weight_transfer_engine(self, init_info):
        self._check_weight_transfer_engine()
        typed = self.weight_transfer_engine.parse_init_info(init_info)
        self.weight_transfer_engine.init_transfer_engine(typed)

    def _refuse_active(self):
        if self._weight_update_active:
            raise RuntimeError(
                "start_weight_update called while a weight update is already "
                "active. Call finish_weight_update first."
            )

    if VERSION.engine_lifecycle:

        def start_weight_update(self, is_checkpoint_format=True):
            self._start_weight_update()

        if VERSION.draft_target:

            def start_draft_weight_update(self):
                self._start_weight_update(is_draft=True)

        def _start_weight_update(self, is_draft=False):
            self._check_weight_transfer_engine()
            engine = self.weight_transfer_engine
            if is_draft and not getattr(engine, "supports_draft_weight_update", False):
                raise RuntimeError(f"{type(engine).__name__} does not support draft model weight updates.")
            self._refuse_active()
            try:
                if is_draft:
                    self._set_draft_weight_update_target()
                engine.start_weight_update()
            except BaseException:
                if VERSION.draft_target:
                    engine.reset_weight_update_target()
                raise
            self._weight_update_active = True
            self._weight_update_is_draft = is_draft

        def _set_draft_weight_update_target(self):
            drafter = getattr(getattr(self.model_runner, "drafter", None), "model", None)
            if drafter is None:
                raise RuntimeError("No draft model to update: speculative decoding is not enabled.")
            spec = self.vllm_config.speculative_config
            self.weight_transfer_engine.set_weight_update_target(drafter, spec.draft_model_config)

        def update_weights(self, update_info):
            self._check_weight_transfer_engine()
            if not self._weight_update_active:
                raise RuntimeError("start_weight_update must be called before update_weights.")
            try:
                self.weight_transfer_engine.update_weights(update_info)
            except BaseException:
                self._weight_update_active = False
                if VERSION.draft_target:
                    self.weight_transfer_engine.reset_weight_update_target()
                raise

        def finish_weight_update(self):
            self._check_weight_transfer_engine()
            if not self._weight_update_active:
                raise RuntimeError("finish_weight_update called without a matching start_weight_update.")
            self.weight_transfer_engine.finish_weight_update()
            if VERSION.draft_target:
                self.weight_transfer_engine.reset_weight_update_target()
            self._weight_update_active = False

    else:

        def start_weight_update(self, is_checkpoint_format=True):
            self._check_weight_transfer_engine()
            self._refuse_active()
            if is_checkpoint_format:
                from ...model_executor.model_loader.reload import initialize_layerwise_reload

                initialize_layerwise_reload(self.model_runner.model)
            self._is_checkpoint_format = is_checkpoint_format
            self._weight_update_active = True

        def update_weights(self, update_info):
            self._check_weight_transfer_engine()
            if not self._weight_update_active:
                raise RuntimeError("start_weight_update must be called before update_weights.")
            typed = self.weight_transfer_engine.parse_update_info(update_info)
            try:
                self.weight_transfer_engine.receive_weights(
                    typed, load_weights=self.model_runner.model.load_weights
                )
            except BaseException:
                self._weight_update_active = False
                raise

        def finish_weight_update(self):
            self._check_weight_transfer_engine()
            if not self._weight_update_active:
                raise RuntimeError("finish_weight_update called without a matching start_weight_update.")
            if self._is_checkpoint_format:
                from ...model_executor.model_loader.reload import finalize_layerwise_reload

                finalize_layerwise_reload(self.model_runner.model, self.vllm_config.model_config)
            self._weight_update_active = False
