"""``python -m compat_matrix`` runs roundpipe-parity."""

import sys

from .cli import main

sys.exit(main())
