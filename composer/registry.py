"""Lookup of an implementation by name in a registry table (attention kernels, expert dispatch, ...).

A table maps a name either to a callable or to a lazy import path 'package.module:attribute'. Paths are
imported only when their name is selected, so a registry may name kernels whose module is absent (or
needs hardware) on this machine without making the import of composer fail.
"""

import importlib
from collections.abc import Callable, Mapping


def resolve(table: Mapping[str, str | Callable], name: str, kind: str) -> Callable:
    """Returns the implementation registered under `name`, importing it first if it is a path.

    Raises ValueError naming the choices for an unknown name, and ImportError (naming the path) when the
    module of a selected path cannot be imported.
    """
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; registered: {', '.join(sorted(table))}")
    return load(table[name], f"{kind} {name!r}")


def load(entry: str | Callable, what: str) -> Callable:
    """`entry` if callable, else the attribute at the path 'module:attr' (`what` names it in errors)."""
    if callable(entry):
        return entry
    module_name, _, attr = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"{what} needs {entry}, which cannot be imported: {e}") from e
    return getattr(module, attr)
