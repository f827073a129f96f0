"""Stand-in of sgl-project/sglang python/sglang/srt/model_executor/model_runner.py.

- All cells: ``model``, ``tp_rank``, ``tp_size``, ``device``, ``gpu_id``.
- v0.5.x and sglang-miles v0.5.16: ``init_weights_update_group(master_address, master_port,
  rank_offset, world_size, group_name, backend)`` joins as rank ``rank_offset + tp_rank``
  through init_custom_process_group; ``destroy_weights_update_group(group_name)`` answers "The
  group to be destroyed does not exist." for an unknown name.
- v0.5.x: ``update_weights_from_distributed(names, dtypes, shapes, group_name, load_format)``
  receives and loads (model.load_weights) at once, answering (success, message);
  ``update_weights_from_tensor(named_tensors, load_format)`` loads the pairs the same way.
- sglang-miles v0.5.16 (the manager version that calls ``model_runner.receive_weights_from_
  distributed`` and ``runner.load_weights``): receive without loading, then load.
- main (PR #28575): those moved to ``model_runner.weight_updater`` (a WeightUpdater).
- sglang-miles LoRA (@a0e1292f): ``lora_manager`` (the target's; ``--max-lora-rank 64``, every
  projection targeted); ``load_lora_adapter_from_distributed(lora_ref, names, dtypes, shapes,
  config_dict, group_name, added_tokens_config=None, upsert=False)`` asserts the group is one of
  its own, receives every tensor (one broadcast each, in ``names`` order) and hands the dict to
  ``lora_manager.load_lora_adapter_from_tensors``, answering success false ("Failed to receive
  LoRA adapter weights from distributed: ...") when the receive raises;
  ``load_lora_adapter_from_tensors`` and ``unload_lora_adapter`` go to the manager.
- Sessions (PRs #28001/#28710): ``begin_weight_update()`` restores in-place-packed weights to a
  loadable layout; ``end_weight_update(run_post_load)`` runs the quantization post-processing
  (here the draft's tiled shuffle, undone at begin). Counted, so tests can see how often.
"""


from sglang.cells import CELL
from sglang.srt.model_executor import receive as _receive
from sglang.srt.utils import destroy_custom_process_group, init_custom_process_group


def _restore(model):
    """Back to the loadable layout: the inverse of the model's post-load processing."""
    if hasattr(model, "LAYOUT"):
        for p in model.parameters():
            if p.dim() == 2:
                model._layout(p.data, undo=True)


class ModelRunner:
    def __init__(self, model, *, tp_rank, tp_size, role=""):
        self.model, self.tp_rank, self.tp_size, self.role = model, tp_rank, tp_size, role
        self.device, self.gpu_id = "cpu", 0
        self.begun = 0
        self.post_processed = 0
        self._model_update_group = {}
        if CELL.lora and not role:
            from sglang.srt.lora.lora_manager import LoRAManager

            self.lora_manager = LoRAManager(max_lora_rank=64, target_modules=LORA_TARGETS)
        if CELL.weight_updater:
            from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

            self.weight_updater = WeightUpdater(
                tp_rank=tp_rank,
                device=self.device,
                gpu_id=self.gpu_id,
                get_model=lambda: self.model,
                get_model_runner=lambda: self,
                weight_update_receivers=_receivers(),
            )

    def begin_weight_update(self):
        _restore(self.model)
        self.begun += 1

    def end_weight_update(self, run_post_load=False):
        post = getattr(self.model, "process_weights_after_loading", None)
        if post is not None:
            post()
        self.post_processed += 1


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load_lora_adapter_from_distributed(
    self, lora_ref, names, dtypes, shapes, config_dict, group_name, added_tokens_config=None, upsert=False
):
    from sglang.srt.managers import io_struct as io

    assert group_name in self._model_update_group, (
        f"Group {group_name} not in {list(self._model_update_group.keys())}. "
        "Please call `init_weights_update_group` first."
    )
    try:
        tensors = dict(_receive.receive(names, dtypes, shapes, self._model_update_group[group_name]))
    except Exception as e:
        return io.LoRAUpdateOutput(
            success=False, error_message=f"Failed to receive LoRA adapter weights from distributed: {e}"
        )
    return self.lora_manager.load_lora_adapter_from_tensors(
        lora_ref, tensors, config_dict, added_tokens_config, upsert=upsert
    )


def load_lora_adapter_from_tensors(
    self, lora_ref, tensors, config_dict, added_tokens_config=None, upsert=False
):
    return self.lora_manager.load_lora_adapter_from_tensors(
        lora_ref, tensors, config_dict, added_tokens_config, upsert=upsert
    )


def unload_lora_adapter(self, lora_ref):
    return self.lora_manager.unload_lora_adapter(lora_ref)


def _receivers():
    import os

    return [p for p in os.environ.get("SGLANG_STANDIN_WEIGHT_UPDATE_RECEIVERS", "").split(",") if p] or None


def init_weights_update_group(
    self, master_address, master_port, rank_offset, world_size, group_name, backend="nccl"
):
    try:
        self._model_update_group[group_name] = init_custom_process_group(
            backend=backend,
            init_method=f"tcp://{master_address}:{master_port}",
            world_size=world_size,
            rank=rank_offset + self.tp_rank,
            group_name=group_name,
        )
        return True, "Succeeded to initialize custom process group."
    except Exception as e:
        return False, f"Failed to initialize custom process group: {e}."


def destroy_weights_update_group(self, group_name):
    if group_name not in self._model_update_group:
        return False, "The group to be destroyed does not exist."
    destroy_custom_process_group(self._model_update_group.pop(group_name))
    return True, "Succeeded to destroy custom process group."


def receive_weights_from_distributed(self, names, dtypes, shapes, group_name, load_format=None):
    assert group_name in self._model_update_group, (
        f"Group {group_name} not in {list(self._model_update_group.keys())}. "
        "Please call `init_weights_update_group` first."
    )
    return _receive.receive(names, dtypes, shapes, self._model_update_group[group_name])


def load_weights(self, weights):
    self.model.load_weights(iter(weights))


def update_weights_from_distributed(self, names, dtypes, shapes, group_name, load_format=None):
    try:
        weights = receive_weights_from_distributed(self, names, dtypes, shapes, group_name, load_format)
        self.model.load_weights(iter(weights))
        return True, "Succeeded to update parameter online."
    except Exception as e:
        return False, (
            f"Failed to update parameter online: {e}. The full weights of the ModelRunner are "
            "partially updated. Please discard the whole weights."
        )


if not CELL.weight_updater:
    ModelRunner.init_weights_update_group = init_weights_update_group
    ModelRunner.destroy_weights_update_group = destroy_weights_update_group


def update_weights_from_tensor(self, named_tensors, load_format=None):
    try:
        self.model.load_weights(iter(named_tensors))
        return True, "Success"
    except Exception as e:
        return False, f"Failed to update weights from tensor: {e}"


if CELL.per_worker_update:
    ModelRunner.update_weights_from_distributed = update_weights_from_distributed
    ModelRunner.update_weights_from_tensor = update_weights_from_tensor
if CELL.manager and not CELL.weight_updater:
    ModelRunner.receive_weights_from_distributed = receive_weights_from_distributed
    ModelRunner.load_weights = load_weights
if CELL.lora:
    ModelRunner.load_lora_adapter_from_distributed = load_lora_adapter_from_distributed
    ModelRunner.load_lora_adapter_from_tensors = load_lora_adapter_from_tensors
    ModelRunner.unload_lora_adapter = unload_lora_adapter
