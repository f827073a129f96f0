"""python -m weightcast.reference: serves the reference engine (main.py)."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
