"""Stand-in of sgl-project/sglang python/sglang/srt/lora/lora_manager.py as on the sglang-miles
branch (read @a0e1292f2bdb255ac758e95a9ba7748c2787e8b3): one TP rank's adapters.

Reproduced: ``load_lora_adapter_from_tensors(lora_ref, tensors, config_dict,
added_tokens_config=None, upsert=False)`` and ``unload_lora_adapter(lora_ref)``, each answering a
``LoRAUpdateOutput`` (success, error_message, loaded_adapters {name: lora_path}); the config read
as ``LoRAConfig.from_dict`` does (``r``, ``lora_alpha``, ``target_modules`` required); a new
adapter whose name is held refused with "Failed to load LoRA adapter NAME because it is already
loaded"; an upsert of a held id replacing it in place, the old one kept when the new one fails;
the rank checked against ``--max-lora-rank`` and the modules against ``--lora-target-modules``.
Each tensor is kept whole here (SGLang slices it into its memory pool per TP rank); the stand-in
checks every tensor is a lora_A or lora_B of a targeted module, as its weight initialisation
would fail otherwise.
"""

import re

from sglang.srt.managers import io_struct as io

_TENSOR = re.compile(r"^(?:base_model\.model\.)?(.+)\.(lora_[AB])\.weight$")


class LoRAManager:
    def __init__(self, max_lora_rank, target_modules):
        self.max_lora_rank, self.target_modules = max_lora_rank, set(target_modules)
        self.loras = {}  # lora_id -> {"ref", "config", "tensors"}

    def _result(self, success, error_message=None):
        loaded = {a["ref"].lora_name: a["ref"].lora_path for a in self.loras.values()}
        return io.LoRAUpdateOutput(success=success, error_message=error_message, loaded_adapters=loaded)

    def _config(self, config_dict):
        missing = [k for k in ("r", "lora_alpha", "target_modules") if k not in (config_dict or {})]
        if missing:
            raise ValueError(f"LoRA config is missing {missing}")
        r, modules = int(config_dict["r"]), set(config_dict["target_modules"])
        if r > self.max_lora_rank:
            raise ValueError(
                f"LoRA adapter rank {r} exceeds --max-lora-rank {self.max_lora_rank}; ensure that the "
                "LoRA adapter's rank is within the configured `--max-lora-rank`"
            )
        if not modules <= self.target_modules:
            raise ValueError(
                f"LoRA target modules {sorted(modules - self.target_modules)} are not in "
                f"--lora-target-modules {sorted(self.target_modules)}"
            )
        return modules

    def load_lora_adapter_from_tensors(
        self, lora_ref, tensors, config_dict, added_tokens_config=None, upsert=False
    ):
        update = upsert and lora_ref.lora_id in self.loras
        try:
            modules = self._config(config_dict)
            if not update and any(a["ref"].lora_name == lora_ref.lora_name for a in self.loras.values()):
                raise ValueError(
                    f"Failed to load LoRA adapter {lora_ref.lora_name} because it is already loaded"
                )
            kept = {}
            for name, t in tensors.items():
                m = _TENSOR.match(name)
                if m is None or m.group(1).rsplit(".", 1)[-1] not in modules:
                    raise ValueError(f"LoRA tensor {name} is not a lora_A/lora_B of a target module")
                kept[name] = t.detach().clone()
        except ValueError as e:
            return self._result(False, str(e))
        self.loras[lora_ref.lora_id] = {"ref": lora_ref, "config": dict(config_dict), "tensors": kept}
        return self._result(True)

    def unload_lora_adapter(self, lora_ref):
        if self.loras.pop(lora_ref.lora_id, None) is None:
            return self._result(False, f"LoRA adapter {lora_ref.lora_name} is not loaded")
        return self._result(True)

    def held(self):
        """name -> {tensor name: tensor} (the harness's view, not SGLang's)."""
        return {a["ref"].lora_name: a["tensors"] for a in self.loras.values()}
