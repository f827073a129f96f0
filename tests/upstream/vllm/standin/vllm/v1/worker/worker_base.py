"""Stand-in of vllm/v1/worker/worker_base.py's WorkerWrapperBase.init_worker: load the general
plugins in the worker process (@02432253), then append --worker-extension-cls to the worker
class's bases, refusing an extension attribute the worker class already has (upstream:
"Worker class ... already has an attribute ..., which conflicts with the worker extension
class ...").
"""

import importlib

from ...plugins import load_general_plugins
from .gpu_worker import Worker


def resolve(qualname):
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


class WorkerWrapperBase:
    def __init__(self, vllm_config, rank):
        self.vllm_config, self.rank = vllm_config, rank
        self.worker = None

    def init_worker(self, model_runner):
        load_general_plugins()
        worker_class = Worker
        ext_name = self.vllm_config.parallel_config.worker_extension_cls
        if ext_name:
            extension = resolve(ext_name)
            for attr in dir(extension):
                if attr.startswith("__"):
                    continue
                if hasattr(worker_class, attr):
                    raise ValueError(
                        f"Worker class {worker_class} already has an attribute {attr}, which "
                        f"conflicts with the worker extension class {extension}."
                    )
            worker_class = type(worker_class.__name__, (worker_class, extension), {})
        self.worker = worker_class(self.vllm_config, self.rank, model_runner)
        return self.worker
