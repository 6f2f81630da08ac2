"""What a run records: MLflow from rank 0 (params: the resolved config, the config file, metrics) and
the plain `metrics.jsonl` beside the checkpoints.

By default the store is a local sqlite database in train.output_dir (no server needed; works
offline); `tracking.uri` may name a server. The run id is kept in the output folder so that a
resumed run continues the same MLflow run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from implicit_megatron.config import Config

RUN_ID_FILE = "mlflow_run_id"
METRICS_FILE = "metrics.jsonl"


def flatten(data: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:6000]
    return out


class Tracker:
    """Does nothing on ranks other than 0 or when tracking is disabled."""

    def __init__(self, cfg: Config, active: bool):
        self.run_id = None
        if not (active and cfg.tracking.enabled):
            return
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient

        out = Path(cfg.output_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        local = cfg.tracking.uri is None
        uri = f"sqlite:///{out / 'mlflow.db'}" if local else cfg.tracking.uri
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(cfg.tracking.experiment)
        if experiment is None:  # a server keeps artifacts where it is configured to; a local store beside it
            location = (out / "mlflow-artifacts").as_uri() if local else None
            experiment_id = self.client.create_experiment(cfg.tracking.experiment, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        id_file = out / RUN_ID_FILE
        if id_file.is_file():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        run = self.client.create_run(experiment_id, run_name=cfg.name)
        self.run_id = run.info.run_id
        self._log_config(cfg, out)
        id_file.write_text(self.run_id + "\n")

    def _log_config(self, cfg: Config, out: Path) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten(cfg.to_dict()).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_artifact(self.run_id, str(out / "config.yaml"))  # written by the trainer

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run_id is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        try:
            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])
        except Exception as err:  # noqa: BLE001 - a full disk or a lost server must not end the training
            print(f"[train] warning: MLflow logging stopped at step {step} ({type(err).__name__}: "
                  f"{str(err).splitlines()[0] if str(err) else ''}); metrics.jsonl keeps every metric", flush=True)
            self.run_id = None

    def finish(self, status: str = "FINISHED") -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)


def append_metrics(output_dir: str | Path, step: int, metrics: dict[str, float]) -> None:
    """One line of `metrics.jsonl`, the plain record next to the checkpoints (for scripts and tests)."""
    with open(Path(output_dir) / METRICS_FILE, "a") as handle:
        handle.write(json.dumps({"step": step, **metrics}) + "\n")


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


def validation_text(ev: dict) -> str:
    """One validation record as the run's last line gives it."""
    measure = f"accuracy {ev['val/accuracy']:.4f}" if "val/accuracy" in ev else f"perplexity {ev['val/ppl']:.2f}"
    passes = f", {ev['val/solver_iterations']:.1f} solver passes per forward" if "val/solver_iterations" in ev else ""
    return f"validation {measure} (loss {ev['val/loss']:.4f}){passes}"
