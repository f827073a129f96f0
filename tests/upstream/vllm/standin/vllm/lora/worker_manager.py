"""Stand-in of vllm/lora/worker_manager.py (``LRUCacheWorkerLoRAManager``) with what it calls in
vllm/lora/peft_helper.py and vllm/lora/lora_model.py, as read at vllm-project/vllm
@bb1d76e5bfb6f2315f4414d1dc4a84f1e7b22e75 (worker_manager.py), @e745bafffc44744aa601169f8c6f325e47ca7cd5
(peft_helper.py) and @532cc2581840104cf00297b7ea6a187420456403 (lora_model.py).

Reproduced: ``add_adapter(request)`` loads when the id is new or ``load_inplace`` is set (the
adapter held under that id replaced whole); ``_load_adapter`` reads ``adapter_config.json``
(``PEFTHelper.from_dict``: "Missing required configuration fields" without r, lora_alpha,
target_modules; ``validate_legal``: a rank above ``max_lora_rank`` refused), then the tensors from
``adapter_model.safetensors``, else ``adapter_model.bin``, else ``adapter_model.pt`` (torch.load,
weights only), a tensor of a module outside the expected ones refused naming it; any failure
raised as "Loading lora NAME failed: ..." (no adapter directory: "No adapter found for PATH").
Each adapter is kept whole (vLLM slices it per TP rank into its punica buffers).
"""

import json
import os
import re

import torch

_TENSOR = re.compile(r"^(?:base_model\.model\.)?(.+)\.(lora_[AB])\.weight$")


class LRUCacheWorkerLoRAManager:
    def __init__(self, max_lora_rank, expected_modules):
        self.max_lora_rank, self.expected_modules = max_lora_rank, set(expected_modules)
        self.adapters = {}  # lora_int_id -> {"name", "config", "tensors"}

    def _load_adapter(self, request):
        path = request.lora_path
        try:
            if not os.path.isdir(path):
                raise ValueError(f"No adapter found for {path}")
            with open(os.path.join(path, "adapter_config.json")) as f:
                config = json.load(f)
            missing = [k for k in ("r", "lora_alpha", "target_modules") if k not in config]
            if missing:
                raise ValueError(f"Missing required configuration fields: {missing}")
            if config["r"] > self.max_lora_rank:
                raise ValueError(
                    f"LoRA rank {config['r']} is greater than max_lora_rank {self.max_lora_rank}."
                )
            for file in ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt"):
                full = os.path.join(path, file)
                if os.path.isfile(full):
                    if file.endswith(".safetensors"):
                        raise ValueError("the stand-in reads no safetensors (the library is not installed)")
                    tensors = torch.load(full, map_location="cpu", weights_only=True)
                    break
            else:
                raise ValueError(f"{path} doesn't contain tensors")
            unexpected = []
            for name in tensors:
                m = _TENSOR.match(name)
                if m is None or m.group(1).rsplit(".", 1)[-1] not in self.expected_modules:
                    unexpected.append(name)
            if unexpected:
                raise ValueError(
                    f"While loading {path}, expected target modules in {sorted(self.expected_modules)} "
                    f"but received {unexpected}. Please verify that the loaded LoRA module is correct"
                )
        except Exception as e:
            raise RuntimeError(f"Loading lora {request.lora_name} failed: {e}") from e
        return {"name": request.lora_name, "config": config, "tensors": tensors}

    def add_adapter(self, request):
        if request.lora_int_id in self.adapters and not request.load_inplace:
            return False
        self.adapters[request.lora_int_id] = self._load_adapter(request)
        return True

    def remove_adapter(self, lora_int_id):
        return self.adapters.pop(lora_int_id, None) is not None

    def list_adapters(self):
        return set(self.adapters)
