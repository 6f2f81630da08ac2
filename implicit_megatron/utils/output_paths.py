"""Whether an output can be written where it is asked for, found before the work that makes it.

A tool that evaluates for an hour and then cannot write its results, or a launch that starts its
ranks and then cannot make its run folder, wastes the run; these checks say in one line, before
anything starts, what stands in the way: a name or path longer than a file system takes, a file
where a folder is asked for (or the reverse), a file among its parents, or a folder this user cannot
write (a read-only file system included); for a run folder (`run_folder_problem`), also a symbolic
link in its place and a place inside another run's folder.
"""

from __future__ import annotations

import os
from pathlib import Path

NAME_MAX, PATH_MAX = 255, 4096  # bytes, Linux's (and most file systems'): a longer one is ENAMETOOLONG


def first_unwritable(folder: Path) -> Path | None:
    """The folder, or its nearest existing parent (where it would be made), if this user cannot write it."""
    folder = Path(folder)
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return None if os.access(folder, os.W_OK | os.X_OK) else folder


def name_problem(path: Path) -> str | None:
    """Why no file system takes `path` as a name: a part or the whole too long; None when one does."""
    longest = max(path.parts, key=lambda part: len(os.fsencode(part)), default="")
    if len(os.fsencode(longest)) > NAME_MAX:
        return f"holds a name of {len(os.fsencode(longest))} bytes; a file name is at most {NAME_MAX}"
    if len(os.fsencode(str(path.absolute()))) >= PATH_MAX:
        return f"is a path of {len(os.fsencode(str(path.absolute())))} bytes; a path is under {PATH_MAX}"
    return None


def output_problem(path: str | Path, folder: bool) -> str | None:
    """Why `path` cannot be written as a folder (`folder`) or as a file; None when it can."""
    path = Path(path)
    named = name_problem(path)
    if named is not None:
        return named
    try:
        return _place_problem(path, folder)
    except OSError as err:  # a part it cannot look into (EACCES, ELOOP, EIO): said, not a traceback
        return f"cannot be looked at ({err.strerror or type(err).__name__})"


def _place_problem(path: Path, folder: bool) -> str | None:
    if path.exists() and folder and not path.is_dir():
        return "exists and is not a folder"
    if path.exists() and not folder and path.is_dir():
        return "is a folder, not a file"
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{existing} is a file, not a folder"
    blocked = first_unwritable(path if folder else path.parent)
    if blocked is not None:
        return f"{blocked} cannot be written by this user (permissions, or a read-only file system)"
    return None


# what a run leaves in its folder from its first step (train/: the lock, the record, the checkpoints)
RUN_MARKS = ("run.lock", "metrics.jsonl", "checkpoints/latest")


def run_folder_problem(path: str | Path) -> str | None:
    """Why `path` may not be a run's folder (train.output_dir), beyond output_problem: a symbolic link
    (followed, a new run writes wherever it leads: as root, a link to / writes there), or a place
    inside another run's folder (a run writing into another's checkpoint tag makes that run's resume
    refuse it); None when neither."""
    path = Path(path)
    if path.is_symlink():
        return (f"is a symbolic link (to {os.readlink(path)}): a run writes into its own folder only; name the "
                f"folder itself, train.output_dir={path.resolve()}")
    for parent in Path(os.path.abspath(path)).parents:
        marks = [mark for mark in RUN_MARKS if (parent / mark).exists()]
        if marks:
            return (f"lies inside {parent}, the folder of another run (it holds {', '.join(marks)}): a run folder "
                    "holds one run's files; choose a folder outside it")
    return None
