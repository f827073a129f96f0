"""The torch reference engine's former module name, kept so existing command lines work:

    python3 -m weightcast.torch_engine ...   is   python3 -m weightcast.reference ...

The engine lives in the weightcast.reference package."""

import sys

from .reference.main import main, parse_args  # noqa: F401  (re-exported)
from .reference.workers import WorkerError, most_telling  # noqa: F401  (re-exported)

if __name__ == "__main__":
    sys.exit(main())
