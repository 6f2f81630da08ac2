"""What the sweep tools (tools/research/state_tracking.py, tools/research/language_modeling.py) share: seeds from
the command line, and training one run of a sweep through the launcher so that a sweep stopped
anywhere resumes when its command runs again."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def seed_list(text: str, tool: str) -> list[int]:
    """'3' -> seeds 0, 1, 2; '0,2' or '2,' -> those seeds; none is refused, naming --seeds."""
    try:
        seeds = [int(s) for s in text.split(",") if s] if "," in text else list(range(int(text)))
    except ValueError:
        raise SystemExit(f"{tool}: --seeds {text!r}: give a count (3) or a list (0,2 or 2,)") from None
    if not seeds or min(seeds) < 0:
        raise SystemExit(f"{tool}: --seeds {text!r} names no seed to train; give a count of at least 1 "
                         "or a list of seeds from 0 (e.g. 0,2)")
    return seeds


def checkpoint_interval(steps: int) -> int:
    """A tenth of the run: a sweep stopped (Ctrl-C, a killed job) and launched again resumes each
    unfinished run from its last checkpoint and loses at most that much training."""
    return max(1, math.ceil(steps / 10))


def finished(out: Path, steps: int) -> bool:
    latest = out / "checkpoints" / "latest"
    return latest.is_file() and latest.read_text().strip().endswith(f"step{steps}")


def train_run(config: Path, overrides: list[str], out: Path, steps: int, label: str, nproc: int = 1) -> None:
    """Train `config` with `overrides` into `out` through launch/pretrain.sh, its progress on stderr;
    a finished run is left as it is, an unfinished one resumes from its last checkpoint."""
    from implicit_megatron.research.train_progress import run_with_progress

    if finished(out, steps):
        print(f"{label}: finished run in {out}, not trained again", flush=True)
        return
    latest = out / "checkpoints" / "latest"
    started = f", resuming from {latest.read_text().strip()}" if latest.is_file() else ""
    print(f"{label}: training into {out}{started}", flush=True)
    env = {**os.environ, "NPROC": str(nproc), "PYTHON": sys.executable}
    result = run_with_progress(["bash", "launch/pretrain.sh", str(config), *overrides], label, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{label} failed:\n{result.stdout[-6000:]}")


def draw_runs(run_folders: Sequence[Path], png: Path, title: str) -> Path:
    """tools/plot_run.py's panels (loss, passes, residual, accuracy, ...) of `run_folders` on one figure."""
    from implicit_megatron.evaluation.run_plot import plot, read_run

    return plot([read_run(folder) for folder in run_folders], png, title)


def publish(results: dict, folder: Path, report, page: str | None, tag: str, label: str,
            run_folders: Sequence[Path] = ()) -> None:
    """Write FOLDER/results.json and print the sweep's tables; with `page`, save the sweep beside the
    page (with `run_folders`' training curves as <tag>-runs.png) and rebuild it. `report`: the module
    with the sweep's tables, write_sweep and write_page."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(report.tables(results))
    if page:
        saved = Path(page).with_suffix("")
        if run_folders:
            draw_runs(run_folders, saved / f"{tag}-runs.png", f"{tag}: training of each model's first seed")
        report.write_sweep(results, saved, tag)
        print(f"{label} wrote {report.write_page(Path(page))}")
