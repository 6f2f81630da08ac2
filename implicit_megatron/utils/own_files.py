"""Whether a folder holds only its own files: no symbolic link (which could lead a reader to files
nobody checked, or a writer to files outside the folder), no device, pipe or socket, and, for a
folder that will be written (a run folder), no hard-linked file: a file with other names elsewhere
(`cp -al` of another run) changes under all of them when a run appends to it or rewrites it in
place (metrics.jsonl, DeepSpeed's `latest`). Found without following any link.

One kind of link is a run folder's own: those Weights & Biases makes in the run's `wandb/` folder
(tracking.wandb), which nothing of the project reads or writes (tracker_link)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

STAGING_SUFFIX = ".conversion-input"  # checkpoints.universal's hard-linked copy of a tag; removed before any use
WANDB_FOLDER = "wandb"  # where the W&B client keeps a run's files (tracking/dashboards.py: dir=<output_dir>)
WANDB_LINKS = ("latest-run", "debug.log", "debug-internal.log")  # made in wandb/, each to a file or run of it


def foreign_entries(folder: Path, hard_links: bool = False,
                    accepted: Callable[[Path], bool] = lambda path: False) -> list[str]:
    """What in `folder` is not its own plain file or folder, each in a line: the folder itself or
    anything below it that is a symbolic link (but those `accepted` says are the folder's own), a
    device, a pipe or a socket; with `hard_links`, also a file that has another name (outside a
    conversion's staging folder, which links on purpose)."""
    if folder.is_symlink():
        return [] if accepted(folder) else [f"{folder} is a symbolic link (to {os.readlink(folder)})"]
    if folder.exists() and not (folder.is_file() or folder.is_dir()):
        return [f"{folder} is not a plain file or folder"]
    if hard_links and folder.is_file():
        return [found for found in [_hard_linked(folder)] if found]
    found = []
    for root, dirs, files in os.walk(folder):  # a linked folder is listed here, never entered
        for name in sorted(dirs + files):
            path = Path(root, name)
            if path.is_symlink():
                if not accepted(path):
                    found.append(f"{path} is a symbolic link (to {os.readlink(path)})")
                continue
            if not (path.is_file() or path.is_dir()):
                found.append(f"{path} is not a plain file or folder")
                continue
            staged = any(part.endswith(STAGING_SUFFIX) for part in path.relative_to(folder).parts[:-1])
            linked = _hard_linked(path) if hard_links and path.is_file() and not staged else None
            if linked:
                found.append(linked)
    return found


def foreign_entry(folder: Path, hard_links: bool = False) -> str | None:
    """The first of foreign_entries, or None."""
    return next(iter(foreign_entries(folder, hard_links)), None)


def _hard_linked(path: Path) -> str | None:
    names = path.stat().st_nlink
    if names == 1:
        return None
    return (f"{path} is hard-linked (its data has {names} names, and writing it here would change the others: "
            "a copy made with cp -l or cp -al)")


def foreign_entries_inside(folder: Path, hard_links: bool = False,
                           accepted: Callable[[Path], bool] = lambda path: False) -> list[str]:
    """`foreign_entries` for what `folder` holds, the folder itself aside (it may be a link: a run
    folder on another disk)."""
    if not folder.is_dir():
        return []
    return [found for entry in sorted(folder.iterdir()) for found in foreign_entries(entry, hard_links, accepted)]


def foreign_entry_inside(folder: Path, hard_links: bool = False) -> str | None:
    """The first of foreign_entries_inside, or None."""
    return next(iter(foreign_entries_inside(folder, hard_links)), None)


def tracker_link(run_folder: Path) -> Callable[[Path], bool]:
    """Whether a symbolic link in `run_folder` is one the W&B client made: `wandb/latest-run`,
    `wandb/debug.log` and `wandb/debug-internal.log` to a run or file inside `wandb/`, and a run's
    `logs/debug-core.log` inside `wandb/` or in W&B's own log folder (`.../wandb/logs/`, in the user's
    cache), as the client writes them at every start."""
    own = (run_folder / WANDB_FOLDER).resolve()

    def made_by_wandb(path: Path) -> bool:
        try:
            place = path.relative_to(run_folder).parts
        except ValueError:
            return False
        target = (path.parent / os.readlink(path)).resolve()
        inside = target.is_relative_to(own)
        if place[0] != WANDB_FOLDER:
            return False
        if len(place) == 2 and place[1] in WANDB_LINKS:
            return inside
        if len(place) == 4 and place[2:] == ("logs", "debug-core.log"):
            return inside or (target.parent.name == "logs" and target.parent.parent.name == WANDB_FOLDER
                              and target.name.startswith("core-debug"))
        return False

    return made_by_wandb
