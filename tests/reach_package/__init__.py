"""A library package whose ``__init__`` binds no NumPy name, only helpers it imports from a
submodule that does (as many libraries' packages do)."""

from reach_package.core import ramp

__all__ = ["ramp"]
