"""The optional packages, the extra of pyproject.toml that installs each, and the one line a missing
one gets: where the config turns a feature on (the config check), or where a command starts, before
anything else runs. `bash scripts/setup.sh EXTRA` installs an extra into the project's .venv.

    problem = missing("wandb", "tracking.wandb")    # None when it imports
    require("lm_eval", "--tasks lm_eval")           # raises MissingExtra with that line
"""

from __future__ import annotations

import importlib
from types import ModuleType

# top-level module -> (the distribution pip knows it by, the extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "lm_eval": ("lm-eval", "eval"),
    "transformers": ("transformers", "eval"),
    "accelerate": ("accelerate", "eval"),
    "matplotlib": ("matplotlib", "eval"),
    "wandb": ("wandb", "wandb"),
}


class MissingExtra(ImportError):
    """An optional package that does not import here: the message names it, its extra and the command."""


def missing(module: str, what: str) -> str | None:
    """None when `module` imports; else one line saying that `what` needs it and how to install it (a
    package that is there but lacks one of its own dependencies is named the same way)."""
    try:
        importlib.import_module(module)
    except ImportError as err:
        distribution, extra = EXTRAS[module]
        return (f"{what} needs {distribution}, which does not import here ({err}): install the {extra!r} extra: "
                f"bash scripts/setup.sh {extra} (or pip install -e .[{extra}])")
    return None


def require(module: str, what: str) -> ModuleType:
    """`module`, imported; MissingExtra (an ImportError) with missing()'s line when it does not import."""
    problem = missing(module, what)
    if problem is not None:
        raise MissingExtra(problem)
    return importlib.import_module(module)
