"""Stand-in of the `vllm` package for weightcast's upstream conformance harness (never the real
vLLM: it reproduces, in our own code, the interfaces and behaviour weightcast.vllm runs through).

The version it behaves as comes from WEIGHTCAST_STANDIN_VLLM (a row of _matrix.VERSIONS); each
module's docstring names the upstream file and the commit or release it reproduces.
"""

from ._matrix import VERSION

__version__ = VERSION.name
