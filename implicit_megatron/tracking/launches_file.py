"""`launches.jsonl`: one line per launch of a run, written by rank 0 when it starts training.

metrics.jsonl says what each step measured, not where a launch began; a resume, a curriculum's next
phase or an extension each begin one. tools/plot_run.py marks them on the curves.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from implicit_megatron.utils.safe_write import open_append

LAUNCHES_FILE = "launches.jsonl"
KINDS = ("start", "resume")  # resume: from a checkpoint of the run's own folder, continuing its records


@dataclass(frozen=True)
class LaunchRecord:
    step: int  # the steps it trains follow this one
    kind: str  # one of KINDS
    world_size: int
    phase: str | None  # the curriculum phase of its first step (None: a run without phases)
    started: str  # UTC, ISO 8601, to the second


def append_launch(output_dir: str | Path, step: int, resumed: bool, world_size: int, phase: str | None) -> None:
    record = LaunchRecord(step, "resume" if resumed else "start", world_size, phase,
                          datetime.now(timezone.utc).isoformat(timespec="seconds"))
    with open_append(Path(output_dir) / LAUNCHES_FILE) as handle:
        handle.write(json.dumps(asdict(record)) + "\n")


def read_launches(output_dir: str | Path) -> list[LaunchRecord]:
    """Every whole record (a line cut by a kill, damaged or of another shape is left out); none
    where the run has no such file (it began before the file existed)."""
    path = Path(output_dir) / LAUNCHES_FILE
    launches = []
    for raw in path.read_bytes().splitlines() if path.is_file() else []:
        try:
            record = LaunchRecord(**json.loads(raw.decode("utf-8")))
        except (ValueError, TypeError):  # not UTF-8, not JSON, not an object of these fields
            continue
        if type(record.step) is int and record.kind in KINDS:
            launches.append(record)
    return launches
