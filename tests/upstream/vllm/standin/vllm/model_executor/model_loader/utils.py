"""Stand-in of vllm/model_executor/model_loader/utils.py's process_weights_after_loading(model,
model_config, target_device): runs every module's post-load processing (upstream: each quant
method's process_weights_after_loading; here: the model's own, e.g. the draft's tiled shuffle,
which is not idempotent). Counts runs per model (`standin_processed`) so the harness can check
"once per round that loaded the model, never on an untouched one".
"""


def process_weights_after_loading(model, model_config, target_device):
    own = getattr(model, "process_weights_after_loading", None)
    if own is not None:
        own()
    model.standin_processed = getattr(model, "standin_processed", 0) + 1
