"""``python -m fastvideo_cute.warmup``: the ``fastvideo-cute-warmup`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
