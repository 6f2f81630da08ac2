"""A script of tools/ imported as a module, for tests that call its functions directly."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support.processes import ROOT


def load_tool(name: str) -> ModuleType:
    """tools/NAME.py as module NAME, registered in sys.modules (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
