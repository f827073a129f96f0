"""Stand-in of vllm/model_executor/model_loader/reload/ (layerwise reload), as upstream's nccl and
ipc engines use it: initialize_layerwise_reload(model) before a round's first tensor,
finalize_layerwise_reload(model, model_config) after its last, which processes the reloaded
model (post-load processing runs there, once). Finalizing a model that was not initialized
raises, as upstream finds no reload state on it.
"""

from ...._matrix import VERSION
from ..utils import process_weights_after_loading

if not VERSION.layerwise:
    raise ImportError("layerwise reload is not in this vLLM")


def initialize_layerwise_reload(model):
    model.standin_reloading = True
    model.standin_reloads = getattr(model, "standin_reloads", 0) + 1


def finalize_layerwise_reload(model, model_config):
    if not getattr(model, "standin_reloading", False):
        raise RuntimeError("finalize_layerwise_reload: the model has no layerwise reload state")
    model.standin_reloading = False
    process_weights_after_loading(model, model_config, None)
