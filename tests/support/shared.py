"""What many tests only read, made once per test run and shared by pytest-xdist's workers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from data_pipeline.locking import exclusive_lock


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name` in this test run's temporary root (the workers' common parent under xdist),
    filled by `build` in the first worker that asks while the others wait. A failed build leaves
    no mark, so the next one to ask tries again. Tests must copy what they change."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, done = root / name, root / f"{name}.built"
    with exclusive_lock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            done.touch()
    return folder
