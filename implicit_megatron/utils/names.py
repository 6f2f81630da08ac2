"""Names that become file names: runs, phases, checkpoint tags, MLflow experiments.

A name from a config or a command line ends up in a path (`runs/<name>`, `checkpoints/<phase>-step<N>`)
or on a launch command line (`curriculum.run_phase=<phase>`), so it may hold only letters, digits,
'_', '.' and '-', may not start with '.' (hidden: never listed as a tag) and may not hold '..': then
it can neither climb out of its folder nor be split or run by a shell.
"""

from __future__ import annotations

import re
from pathlib import Path

SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
# control characters: a newline or tab splits rows and words, an escape rewrites the terminal
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def name_problem(value: object) -> str | None:
    """Why `value` cannot be a name (None: it can)."""
    if not isinstance(value, str) or not value:
        return "expected a non-empty name"
    if not SAFE_NAME.fullmatch(value):
        return (f"{value!r} may hold only letters, digits, '_', '.' and '-' (and may not start with '.'): it "
                "becomes a file name and part of launch commands")
    if ".." in value:
        return f"{value!r} may not hold '..': it becomes a file name"
    return None


def child_path(folder: Path, name: str, what: str) -> Path:
    """`folder / name` for a safe `name` that stays inside `folder`; ValueError naming `what` otherwise."""
    problem = name_problem(name)
    if problem:
        raise ValueError(f"{folder}: {what} {problem}")
    return folder / name
