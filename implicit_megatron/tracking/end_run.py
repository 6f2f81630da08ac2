"""Record the end of a run's MLflow run where its ranks could not: `launch/pretrain.sh` runs

    python -m implicit_megatron.tracking.end_run RUN_DIR KILLED

after a second Ctrl-C has killed the ranks at once. The run that RUN_DIR's `mlflow_run_id` names, in
the store its saved config.yaml names (else its own mlflow.db), is set to the status if it is still
RUNNING; anything missing or unreachable is one line on stderr and exit 0: the launch's own
outcome is what counts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from implicit_megatron.tracking.tracker import RUN_CONFIG, RUN_ID_FILE, STORE, store_problem

STATUSES = ("KILLED", "FAILED", "FINISHED")


def end_run(folder: Path, status: str, uri: str | None = None) -> str:
    """What was done, in words. `uri`: the store the launch itself tracks into (a rank passes it);
    None: the one the folder's saved config names (pretrain.sh, after the ranks are gone). A local
    store that is a link, a FIFO or no store is not opened."""
    id_file = folder / RUN_ID_FILE
    if not id_file.is_file():
        return f"no MLflow run recorded in {folder}"
    local = f"sqlite:///{folder / STORE}"
    if uri is None:
        saved = folder / RUN_CONFIG
        tracking = ((yaml.safe_load(saved.read_text()) if saved.is_file() else None) or {}).get("tracking") or {}
        uri = tracking.get("uri") or local
    if uri == local:
        if not os.path.lexists(folder / STORE):
            return f"no MLflow store in {folder}"
        problem = store_problem(folder / STORE)
        if problem:
            return f"the MLflow store {folder / STORE} is not used ({problem})"
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run_id = id_file.read_text().strip()
    if client.get_run(run_id).info.status != "RUNNING":
        return f"MLflow run {run_id} had ended already"
    client.set_terminated(run_id, status=status)
    return f"MLflow run {run_id} recorded as {status}"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in STATUSES:
        print(f"usage: python -m implicit_megatron.tracking.end_run RUN_DIR {{{','.join(STATUSES)}}}", file=sys.stderr)
        return 2
    try:
        print(f"end_run: {end_run(Path(argv[0]).resolve(), argv[1])}", file=sys.stderr)
    except Exception as err:  # noqa: BLE001 - the launch has ended already; say why the record could not be made
        print(f"end_run: the MLflow run's end was not recorded ({type(err).__name__}: {err})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
