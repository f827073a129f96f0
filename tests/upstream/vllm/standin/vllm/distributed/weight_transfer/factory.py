"""Stand-in of vllm/distributed/weight_transfer/factory.py (@047c993c): a registry of lazily
imported engine classes; register_engine(name, module_path, class_name) raises ValueError
("Weight transfer engine '<name>' is already registered.") on a duplicate name; create_engine
refuses an unregistered backend and builds the configured one with the version's constructor
arguments. Built-in backends are registered at import, never loaded here.
"""

import importlib

from ..._matrix import VERSION


class WeightTransferEngineFactory:
    _registry = {}

    @classmethod
    def register_engine(cls, name, module_path, class_name):
        if name in cls._registry:
            raise ValueError(f"Weight transfer engine '{name}' is already registered.")

        def loader():
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[name] = loader

    @classmethod
    def create_engine(cls, config, vllm_config, device=None, model=None):
        if config.backend not in cls._registry:
            raise ValueError(
                f"Invalid weight transfer backend: {config.backend}. "
                f"Available engines: {sorted(cls._registry)}"
            )
        engine_cls = cls._registry[config.backend]()
        if VERSION.new_constructor:
            return engine_cls(config, vllm_config, device, model)
        return engine_cls(config, vllm_config.parallel_config)


WeightTransferEngineFactory.register_engine(
    "nccl", "vllm.distributed.weight_transfer.nccl_engine", "NCCLWeightTransferEngine"
)
WeightTransferEngineFactory.register_engine(
    "ipc", "vllm.distributed.weight_transfer.ipc_engine", "IPCWeightTransferEngine"
)
