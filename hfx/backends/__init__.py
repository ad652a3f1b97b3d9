"""Runtimes hfx lowers to. Each module imports its runtime lazily, at call time.

Per runtime, ``_<runtime>.py`` holds the lowering and ``_<runtime>_fixes.py`` the
workarounds of that runtime's bugs, as one tuple the lowering takes as an option
(default shown): ``lower_to_pte(patches=PTE_PATCHES)``. Read, extend or replace it.
"""

from hfx.backends._executorch_fixes import PTE_PATCHES as PTE_PATCHES

__all__ = ["PTE_PATCHES"]
