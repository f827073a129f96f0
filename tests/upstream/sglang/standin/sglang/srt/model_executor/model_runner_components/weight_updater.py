"""Stand-in of sgl-project/sglang python/sglang/srt/model_executor/model_runner_components/
weight_updater.py: the model runner's ``WeightUpdater`` on main.

Reproduced: ``@dataclass(frozen=True, slots=True, kw_only=True)`` (a plug-in cannot hang state on
it); ``init_weights_update_group(master_address, master_port, rank_offset, world_size,
group_name, backend="nccl")`` joining as ``rank_offset + tp_rank``; ``destroy_weights_update_
group(group_name)``; ``receive_weights_from_distributed(names, dtypes, shapes, group_name,
load_format)`` receiving without loading (the scheduler's manager loads each selected runner
through ``load_weights(weights)``), asserting the group exists ("Group G not in [...]"), as
called by scheduler_components/weight_updater.py @00a2ca2e.

External receivers (the version importing weight_sync/external_receiver.py @fd623da6): init takes
``receiver`` / ``receiver_init_payload`` (a payload without receiver is refused; a receiver is
built through the allowlist, owns no torch group, and a name cannot be both); receive is
keyword-only with ``receiver_payload``: on a receiver group names/dtypes/shapes must be empty and
load_format absent, the payload goes to ``receive(payload)`` and nothing is returned to load; a
payload for a group without receiver is refused; destroy forgets the receiver, then calls
``destroy()``.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch

from sglang.cells import CELL, require
from sglang.srt.model_executor import receive as _receive
from sglang.srt.utils import destroy_custom_process_group, init_custom_process_group

require(CELL.weight_updater, __name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightUpdater:
    tp_rank: int
    device: str
    gpu_id: int
    get_model: Callable[[], Any]
    get_model_runner: Callable[[], Any]
    weight_update_receivers: Optional[List[str]] = None
    _model_update_group: dict = field(default_factory=dict)
    _external_receivers: dict = field(default_factory=dict)

    def _init_torch_group(self, master_address, master_port, rank_offset, world_size, group_name, backend):
        if group_name in self._external_receivers:
            return False, (
                f"Failed to initialize custom process group: group {group_name!r} already exists "
                "as an external weight-update receiver."
            )
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
        try:
            if group_name in self._external_receivers:
                self._external_receivers.pop(group_name).destroy()
                return True, "Succeeded to destroy external weight-update receiver."
            if group_name in self._model_update_group:
                destroy_custom_process_group(self._model_update_group.pop(group_name))
                return True, "Succeeded to destroy custom process group."
            return False, "The group to be destroyed does not exist."
        except Exception as e:
            return False, f"Failed to destroy external weight-update receiver: {e}."

    def _receive_torch(self, names, dtypes, shapes, group_name):
        assert group_name in self._model_update_group, (
            f"Group {group_name} not in {list(self._model_update_group.keys())}. "
            "Please call `init_weights_update_group` first."
        )
        return _receive.receive(names, dtypes, shapes, self._model_update_group[group_name])

    def load_weights(self, weights):
        self.get_model().load_weights(iter(weights))

    if not CELL.external_receivers:

        def init_weights_update_group(
            self, master_address, master_port, rank_offset, world_size, group_name, backend="nccl"
        ):
            return self._init_torch_group(
                master_address, master_port, rank_offset, world_size, group_name, backend
            )

        def receive_weights_from_distributed(self, names, dtypes, shapes, group_name, load_format=None):
            return self._receive_torch(names, dtypes, shapes, group_name)

    else:

        def init_weights_update_group(
            self,
            master_address,
            master_port,
            rank_offset,
            world_size,
            group_name,
            backend="nccl",
            receiver=None,
            receiver_init_payload=None,
        ):
            if receiver is None and receiver_init_payload is not None:
                return False, (
                    "Failed to initialize custom process group: receiver_init_payload requires " "receiver."
                )
            if receiver is None:
                return self._init_torch_group(
                    master_address, master_port, rank_offset, world_size, group_name, backend
                )
            from sglang.srt.weight_sync.external_receiver import (
                WeightUpdateReceiverContext,
                build_weight_update_receiver,
            )

            try:
                if group_name in self._external_receivers or group_name in self._model_update_group:
                    raise ValueError(f"group {group_name!r} already exists")
                context = WeightUpdateReceiverContext(
                    model=self.get_model(),
                    device=torch.device(self.device),
                    tp_rank=self.tp_rank,
                    tp_size=self.get_model_runner().tp_size,
                    group_name=group_name,
                    master_address=master_address,
                    master_port=master_port,
                    world_size=world_size,
                    rank_offset=rank_offset,
                    init_payload=receiver_init_payload,
                )
                self._external_receivers[group_name] = build_weight_update_receiver(
                    receiver, self.weight_update_receivers, context
                )
                return True, "Succeeded to initialize external weight-update receiver."
            except Exception as e:
                return False, f"Failed to initialize external weight-update receiver: {e}."

        def receive_weights_from_distributed(
            self, *, names, dtypes, shapes, group_name, load_format=None, receiver_payload=None
        ):
            external = self._external_receivers.get(group_name)
            if external is not None:
                if names or dtypes or shapes:
                    raise ValueError(
                        f"Group {group_name!r} is an external receiver: tensor names/dtypes/shapes "
                        "must be empty; per-round data goes in receiver_payload"
                    )
                if load_format is not None:
                    raise ValueError(
                        f"Group {group_name!r} is an external receiver: load_format is not "
                        "supported on receiver rounds"
                    )
                external.receive(receiver_payload)
                return []
            if receiver_payload is not None:
                raise ValueError(f"Group {group_name!r} has no external receiver to take receiver_payload")
            return self._receive_torch(names, dtypes, shapes, group_name)
