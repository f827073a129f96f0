"""Stand-in of SGLang's package root for the upstream conformance harness (weightcast's
tests/upstream/sglang). Not SGLang: modules of our own that reproduce the interfaces and the
behaviour of the SGLang versions named in ``cells.py`` (each module names the upstream file and
commit it follows). The cell is chosen by SGLANG_STANDIN_CELL."""

from .cells import CELL

__version__ = CELL.version
