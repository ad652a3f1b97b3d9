"""``python -m hfx`` is the ``hfx`` command."""

import sys

from hfx._cli import main

sys.exit(main())
