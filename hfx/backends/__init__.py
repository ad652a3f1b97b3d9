"""Runtimes hfx lowers to. Each module imports its runtime lazily, at call time."""
