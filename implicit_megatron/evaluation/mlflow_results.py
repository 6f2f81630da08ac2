"""Evaluation results into the training run's MLflow store, next to its training curves.

The store is the one the trainer used: the run's `mlflow.db` (or the tracking.uri of the config the
run saved, never of the model evaluated; a store outside the folder only where MLFLOW_TRACKING_URI
names it too, so a folder from someone else cannot send your results elsewhere), and the run named in
its `mlflow_run_id` file; a folder without one gets a new "<name>-eval" run. A local store whose
experiment keeps its artifacts outside the run folder (a store received from elsewhere) is refused
by name. Metrics are logged under `eval/` at the checkpoint's step; the output files as artifacts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from implicit_megatron.config import TrackingConfig
from implicit_megatron.tracking.tracker import (
    ARTIFACTS,
    RUN_CONFIG,
    RUN_ID_FILE,
    STORE,
    artifacts_outside,
    refuse_outside,
    store_problem,
)
from implicit_megatron.utils.own_files import foreign_entry
from implicit_megatron.utils.typed_yaml import ConfigError, parse_yaml


def flat_metrics(results: dict) -> dict[str, float]:
    """The headline numbers of every task, as eval/... metric names."""
    out: dict[str, float] = {}
    if "ppl" in results:
        out["eval/ppl"] = results["ppl"]["ppl"]
        out["eval/nll"] = results["ppl"]["nll"]
    for length, row in (results.get("extrapolation") or {}).get("lengths", {}).items():
        out[f"eval/ppl_{length}"] = row["ppl"]
    for key in ("mean_passes", "phantom_steps", "residual", "converged_frac", "sequential_mean_passes"):
        value = (results.get("dynamics") or {}).get(key)
        if value is not None:
            out[f"eval/dynamics/{key}"] = value
    for key in ("match_rate", "ppl_simultaneous", "ppl_sequential", "ppl_difference"):
        if "duality" in results:
            out[f"eval/duality/{key}"] = results["duality"][key]
    for task, metrics in (results.get("lm_eval") or {}).get("tasks", {}).items():
        for metric, value in metrics.items():
            out[f"eval/{task}/{metric}"] = value
    return out


def destination(run_dir: str | Path) -> tuple[str, str, bool]:
    """(tracking URI, experiment, whether the store is the folder's own sqlite file) of a run folder:
    from the config its trainer saved there (config.yaml), else the folder's local store, as training
    logs. Never from the model being evaluated: an export or checkpoint from elsewhere names in its
    config whatever store its sender chose. ValueError naming what is wrong."""
    folder = Path(run_dir).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"run folder {folder} does not exist")
    saved = folder / RUN_CONFIG
    try:
        tracking = ((parse_yaml(saved.read_text(), str(saved)) if saved.is_file() else None) or {}).get("tracking") \
            or {}
    except (ConfigError, UnicodeDecodeError, AttributeError) as err:
        raise ValueError(f"{saved}: not the config a run saved ({type(err).__name__}); --run needs a run folder") \
            from None
    uri, experiment = tracking.get("uri"), tracking.get("experiment") or TrackingConfig().experiment
    if not uri or uri == f"sqlite:///{folder / STORE}":
        return f"sqlite:///{folder / STORE}", experiment, True
    if uri != os.environ.get("MLFLOW_TRACKING_URI"):
        # the folder may come from someone else: a store elsewhere (another file, a server) would
        # receive your results only where you say so yourself
        raise ValueError(f"{saved}: tracking.uri {uri!r} is a store outside the run folder; results are logged "
                         f"there only when you name it yourself: MLFLOW_TRACKING_URI={uri!r}")
    return uri, experiment, False


def check_destination(run_dir: str | Path):
    """The MLflow client of the run folder's store (`destination`) and the run its `mlflow_run_id`
    names (None: none yet), after refusing, by name, a local store that would write artifacts
    outside the folder (its run's, or the experiment's a new run would join)."""
    folder = Path(run_dir).resolve()
    uri, experiment_name, local = destination(folder)
    store = folder / STORE
    problem = store_problem(store) if local and os.path.lexists(store) else None
    if problem:
        raise ValueError(f"{store}: not an MLflow store results can be logged to ({problem}); move it aside "
                         "(a resume of the run then starts a new store) or log to another run folder")
    linked = foreign_entry(folder / ARTIFACTS) if local and os.path.lexists(folder / ARTIFACTS) else None
    if linked:  # MLflow would write the results' files through it
        raise ValueError(f"{linked}: a run's local store keeps its artifacts in the run folder's own files; "
                         "remove it, or log to another run folder")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    id_file = folder / RUN_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() else None
    if local and run_id:
        refuse_outside(artifacts_outside(folder, client.get_run(run_id).info.artifact_uri, f"run {run_id}"))
    elif local and (folder / STORE).is_file():
        experiment = client.get_experiment_by_name(experiment_name)
        if experiment is not None:
            refuse_outside(artifacts_outside(folder, experiment.artifact_location, f"experiment {experiment.name!r}"))
    return client, run_id


def log_results(run_dir: str | Path, name: str, results: dict, files: list[Path]) -> str:
    """Log metrics and files into the run folder's store (`check_destination`); returns the MLflow run
    id. A new run, where the folder names none, is called `<name>-eval`."""
    from mlflow.entities import Metric

    folder = Path(run_dir).resolve()
    client, run_id = check_destination(folder)
    if run_id is None:
        _, experiment_name, local = destination(folder)
        experiment = client.get_experiment_by_name(experiment_name)
        location = (folder / ARTIFACTS).as_uri() if local else None
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(
            experiment_name, artifact_location=location)
        run_id = client.create_run(experiment_id, run_name=f"{name}-eval").info.run_id
        client.set_terminated(run_id)
    now, step = int(time.time() * 1000), int(results["model"].get("step") or 0)
    metrics = [Metric(k, float(v), now, step) for k, v in flat_metrics(results).items()]
    for i in range(0, len(metrics), 500):
        client.log_batch(run_id, metrics=metrics[i:i + 500])
    for path in files:
        client.log_artifact(run_id, str(path), artifact_path="evaluation")
    return run_id
