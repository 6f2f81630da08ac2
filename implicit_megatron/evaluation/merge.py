"""Evaluating into a folder that already holds results: keep what is still true, say what is replaced.

An evaluation of the same model (source, checkpoint tag, solver) on the same data keeps the tasks of
the earlier results that this one did not run; anything else replaces the earlier results, and the
log says so. Plots whose task is no longer in the results are removed, by name, so that no stale
figure sits beside new tables.
"""

from __future__ import annotations

import json
from pathlib import Path

PLOTS = {"extrapolation": "per_position_ppl.png", "dynamics": "iterations_per_token.png", "duality": "duality.png"}
TASK_KEYS = ("ppl", "extrapolation", "dynamics", "duality", "lm_eval")


def same_evaluation(a: dict, b: dict) -> bool:
    """The same model (source, tag, solver) on the same data."""
    fields = ("source", "tag", "solver")
    return all(a["model"].get(f) == b["model"].get(f) for f in fields) and a.get("data") == b.get("data")


def merge_into(out: Path, results: dict, log) -> dict:
    """`results` with the earlier tasks of `out/results.json` that still hold; logs what it keeps or replaces."""
    path = out / "results.json"
    try:
        earlier = json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        earlier = None
        log(f"{path}: unreadable; replaced")
    if earlier is None:
        return results
    kept = [t for t in TASK_KEYS if t in earlier and t not in results]
    if not same_evaluation(earlier, results):
        log(f"{path}: held results of another model, checkpoint, solver or data "
            f"({earlier['model'].get('label')} from {earlier['model'].get('source')}); replaced")
        return results
    if kept:
        log(f"{path}: kept the earlier {', '.join(kept)} of this same evaluation")
    merged = {**results, **{t: earlier[t] for t in kept}}
    merged["seconds"] = {**{t: s for t, s in earlier.get("seconds", {}).items() if t in kept}, **results["seconds"]}
    return merged


def remove_stale_plots(out: Path, results: dict, log) -> None:
    for task, name in PLOTS.items():
        if task not in results and (out / name).is_file():
            (out / name).unlink()
            log(f"removed {out / name}: its task ({task}) is not in these results")
