"""Stand-in of vllm/model_executor/model_loader/reload/ (layerwise reload), as upstream's nccl and
ipc engines use it (read in reload/layerwise.py of upstream main and forks, 2026-12):
initialize_layerwise_reload(model) puts the parameters on the meta device and wraps the weight
loaders; a layer is processed once all its elements are loaded; finalize_layerwise_reload(model,
model_config) processes what was loaded and puts the kernel tensors of layers that took nothing
back, unprocessed. Here at model granularity: between the two the model is unusable
(`standin_reloading`); loads are counted through the model's load_weights answers, and finalize
runs the post-load processing once if any tensor was loaded, else none. Finalizing a model that
was not initialized raises, as upstream finds no reload state on it.
"""

from ...._matrix import VERSION
from ..utils import process_weights_after_loading

if not VERSION.layerwise:
    raise ImportError("layerwise reload is not in this vLLM")


def initialize_layerwise_reload(model):
    if getattr(model, "standin_reloading", False):
        raise RuntimeError("initialize_layerwise_reload: the model is already being reloaded")
    real = model.load_weights
    model.standin_reload_prev = model.__dict__.get("load_weights")  # an instance override, if any
    model.standin_reloading = True
    model.standin_reload_loaded = 0

    def counted(weights):
        loaded = real(weights)
        model.standin_reload_loaded += 1 if loaded is None else len(loaded)
        return loaded

    model.load_weights = counted


def finalize_layerwise_reload(model, model_config):
    if not getattr(model, "standin_reloading", False):
        raise RuntimeError("finalize_layerwise_reload: the model has no layerwise reload state")
    if model.standin_reload_prev is None:
        del model.load_weights  # the wrapper
    else:
        model.load_weights = model.standin_reload_prev
    model.standin_reloading = False
    if model.standin_reload_loaded:
        process_weights_after_loading(model, model_config, None)
