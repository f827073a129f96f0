"""weightcast: push a Python trainer's weights to rollout engines, without copying them.

    import weightcast
    selector = weightcast.weight_update_selector(speculative_algorithm="EAGLE", mtp_num_layers=0)
    with weightcast.DistributedUpdater(engines=["http://10.0.0.5:30000"], selector=selector,
                                       bind_address="10.0.0.3") as updater:
        for step in range(steps):
            train_step(model)
            report = updater.update(model.state_dict().items())

See docs/python.md for the options, the errors and use under mpirun / torchrun.
"""

from ._weightcast import (  # noqa: F401  (re-exported)
    __version__,
    ConfigError,
    DistributedUpdater,
    EngineError,
    EngineTimeoutError,
    Error,
    InputError,
    PeerError,
    StageResult,
    TimeoutError,
    UpdateError,
    UpdateReport,
    VerifyError,
    weight_update_selector,
)
from .experts import expert_parallel_update  # noqa: F401
from .pipeline import pipeline_update  # noqa: F401
from .receiver import LoadError, Receiver, ReceiverError, Runner, load_weights_runner  # noqa: F401

__all__ = [
    "ConfigError",
    "DistributedUpdater",
    "EngineError",
    "EngineTimeoutError",
    "Error",
    "InputError",
    "LoadError",
    "PeerError",
    "Receiver",
    "ReceiverError",
    "Runner",
    "StageResult",
    "TimeoutError",
    "UpdateError",
    "UpdateReport",
    "VerifyError",
    "expert_parallel_update",
    "load_weights_runner",
    "pipeline_update",
    "weight_update_selector",
]
