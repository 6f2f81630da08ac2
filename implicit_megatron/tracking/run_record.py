"""What an MLflow run records about itself, as MLflow's own integrations record it: who ran what from
which commit (`mlflow.user`, `mlflow.source.*`), tags that a run list is filtered by (architecture,
size, implicit, curriculum, phase), the training shards as dataset inputs, and the config as one
parameter per field (a curriculum's phases: one per phase and field, not a Python list's text).

The tracking store and experiment come from the config, else from MLflow's own environment
variables (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME), else the local store beside the run.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from implicit_megatron.config import Config

REPOSITORY = Path(__file__).resolve().parents[2]
SOURCE_NAME = "implicit_megatron.train"
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # the UI's training view, not GenAI's
# MLflow 3.17's UI ignores that tag: it opens every experiment in its GenAI view unless the browser
# chose "Model training" before, or the page's address asks for the training view.
TRAINING_VIEW = "?workflowType=machine_learning"


def apply_environment(cfg: Config) -> None:
    """tracking.uri and tracking.experiment from MLflow's environment variables where no config file
    or override set them, so that the saved config.yaml says where the run was recorded."""
    if cfg.tracking.uri is None and os.environ.get("MLFLOW_TRACKING_URI"):
        cfg.tracking.uri = os.environ["MLFLOW_TRACKING_URI"]
    if "tracking.experiment" not in cfg.sources and os.environ.get("MLFLOW_EXPERIMENT_NAME"):
        cfg.tracking.experiment = os.environ["MLFLOW_EXPERIMENT_NAME"]


@functools.lru_cache(maxsize=4)
def git_state(root: Path = REPOSITORY) -> dict[str, str]:
    """{commit, branch, dirty} of the code where it is a git checkout; {} where it is not (an
    installed package, an image without git)."""
    if not (root / ".git").exists():
        return {}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "branch": git("rev-parse", "--abbrev-ref", "HEAD") or "",
            "dirty": "unknown" if status is None else str(bool(status)).lower()}


def run_page(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """Where the MLflow UI shows this run, in its model-training view: a server's page, or for a
    store on disk the `mlflow ui` command that serves it and the page it then shows."""
    page = f"#/experiments/{experiment_id}/runs/{run_id}{TRAINING_VIEW}"
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/{page}"
    if tracking_uri.startswith(("sqlite:", "file:", "/")):
        return f"mlflow ui --backend-store-uri {tracking_uri}, then http://127.0.0.1:5000/{page}"
    return None  # a hosted service (databricks, ...) has addresses of its own


def curriculum_text(cfg: Config) -> str:
    if not cfg.implicit.enabled:
        return "explicit"
    phases = cfg.curriculum.phases
    if not phases:
        return f"({cfg.implicit.max_iter}+{cfg.implicit.phantom_steps})"
    return " -> ".join(f"{p.name} ({p.max_iter}+{p.phantom_steps})" for p in phases)


def run_tags(cfg: Config, parameters: int | None) -> dict[str, str]:
    """The tags a new run starts with."""
    tags = {"mlflow.user": _user(), "mlflow.source.name": SOURCE_NAME, "mlflow.source.type": "LOCAL",
            "architecture": cfg.model.arch, "implicit": str(cfg.implicit.enabled).lower(),
            "curriculum": curriculum_text(cfg), "task": cfg.task.kind, "config": str(cfg.source or "")}
    if parameters:
        tags["size"] = _count(parameters)
    git = git_state()
    if git:
        tags.update({"mlflow.source.git.commit": git["commit"], "mlflow.source.git.branch": git["branch"],
                     "mlflow.source.git.dirty": git["dirty"]})
    return tags


def launch_record(cfg: Config, world_size: int, start_step: int) -> dict[str, str]:
    """What a launch of the run was: its config file and overrides, world size, ZeRO stage, the phase it
    ran (`all` for a whole curriculum) and the step it started from. Each launch of a run records
    this as params `launch.<n>.<key>` (params never change, so launch n has its own), the newest also
    as tags."""
    return {"config": str(cfg.source or ""), "overrides": " ".join(cfg.overrides)[:6000],
            "world_size": str(world_size), "zero_stage": str(cfg.distributed.zero_stage),
            "phase": cfg.curriculum.run_phase or "all", "start_step": str(start_step),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def config_params(cfg: Config) -> dict[str, str]:
    """The resolved config, one parameter per field: nested sections by dots, list items by index."""
    return flatten(cfg.to_dict())


def flatten(data, prefix: str = "") -> dict[str, str]:
    if isinstance(data, dict) and data:
        return {k: v for key, value in data.items() for k, v in flatten(value, f"{prefix}{key}.").items()}
    if isinstance(data, list) and data and all(isinstance(item, (dict, list)) for item in data):
        return {k: v for i, item in enumerate(data) for k, v in flatten(item, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): str(data)[:6000]}


def dataset_inputs(cfg: Config) -> list:
    """The training shards of each prefix as an MLflow dataset input: its name, a digest of its
    stats file (what preprocessing recorded: inputs, tokenizer, counts), its token counts."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    from data_pipeline.packed import split_tokens

    inputs = []
    weights = cfg.data.weights or [1.0] * len(cfg.data.prefixes)
    for prefix, weight in zip(cfg.data.prefixes, weights, strict=True):
        stats = Path(f"{prefix}_stats.json")
        recorded = json.loads(stats.read_text()) if stats.is_file() else {}
        digest = hashlib.sha256(stats.read_bytes() if stats.is_file() else prefix.encode()).hexdigest()[:16]
        profile: dict[str, int | None] = {split: split_tokens([prefix], split) for split in ("train", "valid", "test")}
        profile["documents"] = recorded.get("documents")
        dataset = Dataset(name=Path(prefix).name, digest=digest, source_type="local",
                          source=json.dumps({"uri": os.path.abspath(prefix)}),
                          profile=json.dumps({f"{k}_tokens" if k in ("train", "valid", "test") else k: v
                                              for k, v in profile.items()}))
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training"),
                                                  InputTag("weight", str(weight))]))
    return inputs


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry
        return str(os.getuid())


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
