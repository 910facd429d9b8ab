"""Lazy package faces: `from dphil.results import welch` without importing every stage module.

A stage's `__init__.py` names its public API; the module behind a name is imported
on first use, so `import dphil.io` (which every command does) never pulls in
polars, torch or litellm through a sibling's face.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(
    package: str, exports: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: module name -> the public names it provides.

    A module name is one of the package's own modules, or a dotted path such as
    `dphil.core.maths` for names a face shows from a package below it.
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module if "." in module else f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__
