"""Stand-in of vllm/distributed/parallel_state.py's TP rank query (set by the worker)."""

_tp_rank = 0


def get_tensor_model_parallel_rank():
    return _tp_rank
