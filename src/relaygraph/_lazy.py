"""A package's names imported on first use (PEP 562), so that importing the package stays cheap.

``import relaygraph`` is the CLI's first line, and ``relaygraph --help`` imports the eval
command's package: neither should pay for LangChain, LangGraph or the mcp package until a
name that needs them is used. A package lists where each such name lives and sets its module
``__getattr__`` from :func:`lazy_imports`; its ``TYPE_CHECKING`` imports give the names their
types.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_imports(package: str, origins: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` that imports each name of ``origins`` from
    its module.

    A name is imported once: its value is kept in the package's namespace, where Python
    finds it on the next use without calling ``__getattr__`` again.

    Args:
        package: The package's ``__name__``.
        origins: Each name, and the module it is imported from: a full name, or one
            relative to ``package`` (``._golden``).

    Returns:
        The function to assign to the package's ``__getattr__``; for a name it does not
        know it raises :class:`AttributeError`, as a module without one does.
    """
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = origins.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
