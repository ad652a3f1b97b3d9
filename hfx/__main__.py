"""``python -m hfx`` is the ``hfx`` command."""

import sys

from hfx._cli.main import main

sys.exit(main())
