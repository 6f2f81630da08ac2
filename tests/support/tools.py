"""A script of tools/ imported as a module, for tests that call its functions directly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from support.processes import ROOT


def tool_path(name: str) -> Path:
    """tools/NAME.py, or tools/GROUP/NAME.py (bench, node, dev, research)."""
    found = sorted((ROOT / "tools").glob(f"**/{name}.py"))
    assert len(found) == 1, f"tools/ holds {len(found)} scripts named {name}.py"
    return found[0]


def load_tool(name: str) -> ModuleType:
    """The script NAME.py of tools/ as module NAME, registered in sys.modules (its dataclasses look
    their module up)."""
    spec = importlib.util.spec_from_file_location(name, tool_path(name))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
