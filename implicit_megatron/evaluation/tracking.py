"""Evaluation results into the training run's MLflow store, next to its training curves.

The store is the one the trainer used: the run's `mlflow.db` (or the config's tracking.uri), and
the run named in its `mlflow_run_id` file; a folder without one gets a new "<name>-eval" run.
Metrics are logged under `eval/` at the checkpoint's step; the output files as artifacts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from implicit_megatron.config import Config
from implicit_megatron.tracking.tracker import RUN_ID_FILE


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


def log_results(run_dir: str | Path, cfg: Config, results: dict, files: list[Path]) -> str:
    """Log metrics and files; returns the MLflow run id."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    folder = Path(run_dir).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"run folder {folder} does not exist")
    local = cfg.tracking.uri is None
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}" if local else cfg.tracking.uri)
    id_file = folder / RUN_ID_FILE
    if id_file.is_file():
        run_id = id_file.read_text().strip()
    else:
        experiment = client.get_experiment_by_name(cfg.tracking.experiment)
        if experiment is None:
            location = (folder / "mlflow-artifacts").as_uri() if local else None
            experiment_id = client.create_experiment(cfg.tracking.experiment, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        run_id = client.create_run(experiment_id, run_name=f"{cfg.name}-eval").info.run_id
        client.set_terminated(run_id)
    now, step = int(time.time() * 1000), int(results["model"].get("step") or 0)
    metrics = [Metric(k, float(v), now, step) for k, v in flat_metrics(results).items()]
    for i in range(0, len(metrics), 500):
        client.log_batch(run_id, metrics=metrics[i:i + 500])
    for path in files:
        client.log_artifact(run_id, str(path), artifact_path="evaluation")
    return run_id
