"""Stand-in of vllm/distributed/weight_transfer/base.py, per version (_matrix.py names the
commits and docs): the WeightTransferEngine base whose abstract methods a backend must implement
(instantiating one that leaves any abstract fails, as Python's ABC makes it), its constructor,
parse_init_info / parse_update_info (dataclass construction, TypeError -> ValueError), the base's
update_weights (main, 0.25) and draft retargeting (main).
"""

from abc import ABC, abstractmethod

from ..._matrix import VERSION


class WeightTransferEngine(ABC):
    init_info_cls = None
    update_info_cls = None

    def parse_init_info(self, init_dict):
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as e:
            raise ValueError(f"Invalid init_info for {type(self).__name__}: {e}") from e

    def parse_update_info(self, update_dict):
        try:
            return self.update_info_cls(**update_dict)
        except TypeError as e:
            raise ValueError(f"Invalid update_info for {type(self).__name__}: {e}") from e

    @abstractmethod
    def init_transfer_engine(self, init_info):
        raise NotImplementedError

    @abstractmethod
    def shutdown(self):
        raise NotImplementedError


if VERSION.new_constructor:

    class _Constructed(WeightTransferEngine):
        def __init__(self, config, vllm_config, device, model):
            self.config = config
            self.vllm_config = vllm_config
            self.parallel_config = vllm_config.parallel_config
            self.model_config = vllm_config.model_config
            self.device = device
            self.model = model
            if VERSION.draft_target:
                self._default_model_config = self.model_config
                self._default_model = model

else:

    class _Constructed(WeightTransferEngine):
        def __init__(self, config, parallel_config):
            self.config = config
            self.parallel_config = parallel_config


if VERSION.engine_lifecycle:

    class _Lifecycle(_Constructed):
        @abstractmethod
        def start_weight_update(self):
            raise NotImplementedError

        @abstractmethod
        def finish_weight_update(self):
            raise NotImplementedError

        def update_weights(self, update_info):
            # Upstream synchronizes the accelerator after receive_weights (CPU here: nothing to wait for).
            self.receive_weights(self.parse_update_info(update_info))

        @abstractmethod
        def receive_weights(self, update_info):
            raise NotImplementedError

else:

    class _Lifecycle(_Constructed):
        @abstractmethod
        def receive_weights(self, update_info, load_weights):
            raise NotImplementedError


if VERSION.draft_target:

    class _Targeted(_Lifecycle):
        supports_draft_weight_update = True
        defers_processing = False

        def set_weight_update_target(self, model, model_config):
            self.model = model
            self.model_config = model_config

        def reset_weight_update_target(self):
            self.model = self._default_model
            self.model_config = self._default_model_config

else:
    _Targeted = _Lifecycle


if VERSION.trainer_send_abstract:

    class WeightTransferEngine(_Targeted):  # noqa: F811 (the public name, per version)
        @staticmethod
        @abstractmethod
        def trainer_send_weights(iterator, trainer_args):
            raise NotImplementedError

else:

    class WeightTransferEngine(_Targeted):  # noqa: F811
        pass
