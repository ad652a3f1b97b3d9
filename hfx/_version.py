"""The hfx release."""

__version__ = "0.1.0"
