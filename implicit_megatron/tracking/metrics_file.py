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


def whole_records(path: Path) -> tuple[list[tuple[str, dict]], int]:
    """(line, record) of every whole record of a metrics file, and how many lines are none: cut short
    by a kill, not UTF-8, not a JSON object with an integer step (a file damaged or edited)."""
    records, damaged = [], 0
    for raw in path.read_bytes().splitlines() if path.is_file() else []:
        try:
            line = raw.decode("utf-8")
            record = json.loads(line)
        except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
            damaged += 1
            continue
        if isinstance(record, dict) and type(record.get("step")) is int:
            records.append((line, record))
        else:
            damaged += 1
    return records, damaged


def drop_metrics_after(output_dir: str | Path, step: int) -> tuple[list[int], int]:
    """Remove the records of steps after `step` from metrics.jsonl (a resume trains them again, so
    each step keeps one record), and every line that is not a whole record (whole_records); returns
    the steps removed and the count of such lines. The file is replaced atomically."""
    path = Path(output_dir) / METRICS_FILE
    records, damaged = whole_records(path)
    kept = [line for line, record in records if record["step"] <= step]
    dropped = sorted({record["step"] for _, record in records if record["step"] > step})
    if dropped or damaged:
        replace_text(path, "".join(line + "\n" for line in kept))
    return dropped, damaged


def read_metrics(output_dir: str | Path) -> list[dict]:
    """Every whole record of `metrics.jsonl` (a line cut by a kill, or damaged, is left out)."""
    return [record for _, record in whole_records(Path(output_dir) / METRICS_FILE)[0]]
