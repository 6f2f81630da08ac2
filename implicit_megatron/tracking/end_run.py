"""Record the end of a run's MLflow run where its ranks could not: the launch (launch/supervisor.py)
calls `end_run` after a second Ctrl-C has killed the ranks at once, with the tracking.uri of the
config it launched (none: the folder's own mlflow.db), and says its words in its one line; by hand:

    python -m implicit_megatron.tracking.end_run RUN_DIR KILLED [TRACKING_URI]

The run that RUN_DIR's `mlflow_run_id` names, in that store, is set to the status if it is still
RUNNING (one that has that status already, recorded by its rank 0, is said to have it); anything
missing or unreachable is one line on stderr and exit 0: the launch's own outcome is what counts.
The folder's saved config.yaml is never read for the store: it may be a received folder's (a launch
killed before its ranks wrote their own), naming a store or a server of the sender's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from implicit_megatron.tracking.tracker import RUN_ID_FILE, STORE, store_problem

STATUSES = ("KILLED", "FAILED", "FINISHED")


def end_run(folder: Path, status: str, uri: str | None = None) -> str:
    """What was done, in words. `uri`: the store the launch itself tracks into (its config's
    tracking.uri); None: the folder's own mlflow.db. A local store that is a link, a FIFO or no
    store is not opened."""
    id_file = folder / RUN_ID_FILE
    if not id_file.is_file():
        return f"no MLflow run recorded in {folder}"
    local = f"sqlite:///{folder / STORE}"
    uri = uri or local
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
    now = client.get_run(run_id).info.status
    if now == status:  # the ranks' own watcher may have recorded it first: said the same way
        return f"MLflow run {run_id} recorded as {status}"
    if now != "RUNNING":
        return f"MLflow run {run_id} had ended already ({now})"
    client.set_terminated(run_id, status=status)
    return f"MLflow run {run_id} recorded as {status}"


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[1] not in STATUSES:
        print(f"usage: python -m implicit_megatron.tracking.end_run RUN_DIR {{{','.join(STATUSES)}}} [TRACKING_URI]",
              file=sys.stderr)
        return 2
    uri = argv[2] if len(argv) == 3 and argv[2] not in ("", "None") else None  # None: config --get's "no uri"
    try:
        print(f"end_run: {end_run(Path(argv[0]).resolve(), argv[1], uri)}", file=sys.stderr)
    except Exception as err:  # noqa: BLE001 - the launch has ended already; say why the record could not be made
        print(f"end_run: the MLflow run's end was not recorded ({type(err).__name__}: {err})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
