"""The ``hfx`` command line."""

from hfx._cli.main import main as main
