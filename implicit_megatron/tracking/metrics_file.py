"""`metrics.jsonl`: every logged metric of a run, one JSON object per line, beside its checkpoints.

The plain record that scripts, tests and tools/plot_run.py read; written by rank 0 whatever
MLflow does. A resumed run trains some steps again, so their first records are dropped first.
"""

from __future__ import annotations

import json
from pathlib import Path

from implicit_megatron.utils.safe_write import open_append, replace_text

METRICS_FILE = "metrics.jsonl"


def append_metrics(output_dir: str | Path, step: int, metrics: dict[str, float]) -> None:
    """One line of `metrics.jsonl`, the plain record next to the checkpoints (for scripts and tests)."""
    with open_append(Path(output_dir) / METRICS_FILE) as handle:
        handle.write(json.dumps({"step": step, **metrics}) + "\n")


def drop_metrics_after(output_dir: str | Path, step: int) -> list[int]:
    """Remove the records of steps after `step` from metrics.jsonl (a resume trains them again, so
    each step keeps one record), and any line a kill cut short (readers such as pandas take the file
    as JSON lines, whole); returns the steps removed. The file is replaced atomically."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return []
    kept, dropped, torn = [], [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            later = record.get("step", 0) > step
        except (ValueError, AttributeError):
            torn += 1
            continue
        (dropped if later else kept).append(line)
    if dropped or torn:
        replace_text(path, "".join(line + "\n" for line in kept))
    return sorted({json.loads(line)["step"] for line in dropped})


def read_metrics(output_dir: str | Path) -> list[dict]:
    """Every record of `metrics.jsonl` (a line cut by a kill is left out)."""
    path = Path(output_dir) / METRICS_FILE
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows
