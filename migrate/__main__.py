"""``python -m migrate``: the same as the ``roundpipe-migrate`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
