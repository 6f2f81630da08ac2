"""What a run records in MLflow from rank 0 (params: the resolved config, the config file, metrics),
and the dashboards a config asks for beside it (tracking.dashboards); the plain `metrics.jsonl`
is tracking.metrics_file's.

By default the store is a local sqlite database in train.output_dir (no server needed; works
offline); `tracking.uri` may name a server. The run id is kept in the output folder so that a
resumed run continues the same MLflow run.

Tracking never stops a run. A new local store is built under a temporary name and renamed when
its schema is complete, so a kill during its creation leaves no store, not a broken one; a store
that cannot be opened is moved aside (named in a warning) and a new one started; any other
failure turns MLflow off for the launch with a warning, while metrics.jsonl keeps every metric.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from implicit_megatron.config import Config
from implicit_megatron.tracking.dashboards import Dashboards
from implicit_megatron.tracking.run_record import (
    EXPERIMENT_KIND,
    config_params,
    dataset_inputs,
    launch_record,
    run_page,
    run_tags,
)
from implicit_megatron.utils.safe_write import replace_text

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

RUN_ID_FILE = "mlflow_run_id"


STORE = "mlflow.db"
ARTIFACTS = "mlflow-artifacts"  # where a local store keeps its runs' files, in the run folder
RUN_CONFIG = "config.yaml"  # the resolved config a run's trainer saves in its output folder


def artifacts_outside(out: Path, location: str | None, whose: str) -> str | None:
    """Why a local store's experiment or run (`whose`) must not be written to (None: it may): it keeps
    its artifacts at `location`, outside the run folder `out` (a store received with a run folder
    names any place it likes)."""
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    location = location or ""
    parsed = urlparse(location)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost") and \
            Path(url2pathname(parsed.path)).resolve().is_relative_to(out.resolve()):
        return None
    return (f"{out / STORE}: {whose} keeps its artifacts at {location!r}, outside the run folder {out}; a run's "
            f"local store writes into its own folder only (remove {out / STORE} to start a new one, or set "
            "tracking.uri to a server)")


class ArtifactsOutside(ValueError):
    """A local store that would write outside its run folder (our own message, shown whole)."""


def refuse_outside(problem: str | None | bool) -> None:
    if problem:
        raise ArtifactsOutside(problem)


def _warn(message: str) -> None:
    print(f"[train] warning: {message}", flush=True)


def _first_line(err: BaseException) -> str:
    """A foreign error's first line, cut at 300 characters (a server may answer with a whole page);
    our own refusals whole, as their reasons come after the paths they name. An error raised while
    handling another says why by its first cause: MLflow's error on a full disk starts with
    SQLAlchemy's "(raised as a result of Query-invoked autoflush; ...)", and only sqlite's error at
    the bottom of the chain says "database or disk is full"."""
    cause, seen = err, {id(err)}
    while (deeper := cause.__cause__ or cause.__context__) is not None and id(deeper) not in seen:
        cause = deeper
        seen.add(id(cause))
    line = (str(cause).splitlines() or [""])[0]
    line = line if isinstance(cause, ArtifactsOutside) else line[:300]
    named = type(err).__name__ if cause is err else f"{type(err).__name__}, from {type(cause).__name__}"
    return f"{named}: {line}"


def store_problem(db: Path) -> str | None:
    """Why the local store cannot be used (None: a file of its own holding a complete MLflow schema at
    its latest revision). A link would have MLflow write to another file, and opening a FIFO waits
    for a writer that never comes: both are judged without being opened. Read with sqlite itself:
    MLflow keeps one engine per store address for the whole process, and one opened on a broken
    file would outlive the file being moved aside."""
    import sqlite3
    import stat

    mode = db.lstat().st_mode
    if stat.S_ISLNK(mode):
        return "it is a symbolic link"
    if not stat.S_ISREG(mode):
        return "it is not a regular file (a FIFO, a device or a socket)"

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = con.execute("SELECT version_num FROM alembic_version").fetchall() \
                if "alembic_version" in tables else []
    except sqlite3.Error as err:
        return _first_line(err)
    if any(name.startswith("_alembic_tmp_") for name in tables):
        return "its schema migration was interrupted (a _alembic_tmp_ table is left)"
    from mlflow.store.db.utils import _get_latest_schema_revision

    latest = _get_latest_schema_revision()
    if [row[0] for row in version] != [latest]:
        return f"out-of-date or incomplete schema (revision {version[0][0] if version else None}, expected {latest})"
    return None


def _create_store(db: Path) -> None:
    """A new local store, complete or not there at all: built under a temporary name, then renamed.
    MLflow logs each step of making the schema at INFO level ("Creating initial MLflow database
    tables..."): at every new run, nothing to act on, so only its warnings are kept."""
    from mlflow import MlflowClient

    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    building = db.with_name(f"{STORE}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    MlflowClient(tracking_uri=f"sqlite:///{building}").search_experiments(max_results=1)  # makes the schema
    os.replace(building, db)


def local_store(out: Path) -> Path:
    """The run's local store, ready to open: leftovers of an interrupted creation removed, a store
    that cannot be opened moved aside (with a warning naming both files), a missing one created."""
    db = out / STORE
    for leftover in out.glob(f"{STORE}.creating-*"):
        leftover.unlink(missing_ok=True)
    if os.path.lexists(db):
        problem = store_problem(db)
        if problem is None:
            return db
        aside = db.with_name(f"{STORE}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(db, aside)
        (out / RUN_ID_FILE).unlink(missing_ok=True)  # its run is in the store moved aside
        _warn(f"the MLflow store {db} could not be opened ({problem}); moved it to {aside} and started a new "
              "store with a new MLflow run (metrics.jsonl holds every metric of the run)")
    _create_store(db)
    return db


class Tracker:
    """MLflow (tracking.enabled) and the dashboards a config asks for (TensorBoard, Weights & Biases),
    on rank 0; does nothing elsewhere, and never stops the run. The MLflow run is opened (RUNNING)
    when training begins, so a launch stopped before that leaves no run RUNNING."""

    def __init__(self, cfg: Config, active: bool):
        self.run_id: str | None = None
        self.phase: str | None = None
        self.logged_up_to = 0
        self.system: SystemMetricsMonitor | None = None
        self.cfg, self.active = cfg, active
        self.dashboards = Dashboards()

    def _open(self, cfg: Config, step: int, parameters: int | None, resumed: bool, world_size: int) -> None:
        if not (self.active and cfg.tracking.enabled):
            return
        try:
            self._start(cfg, parameters, resumed)
            self._record_launch(cfg, world_size, step)
            if resumed and self.run_id is not None:  # steps MLflow holds already are not sent again
                history = self.client.get_metric_history(self.run_id, "train/loss")
                self.logged_up_to = max((m.step for m in history), default=0)
            self._start_system_metrics(cfg)
        except Exception as err:  # noqa: BLE001 - tracking must never stop a run or its resume
            _warn(f"MLflow tracking is off for this launch ({_first_line(err)}); metrics.jsonl keeps every metric")
            self.run_id = None

    def _say_where(self, run: Run) -> None:
        """One line naming the run and its page, as MLflow's own `end_run` does for a server."""
        page = run_page(self.client.tracking_uri, run.info.experiment_id, run.info.run_id)
        print(f"[train] MLflow run {run.info.run_name}" + (f": {page}" if page else f" ({run.info.run_id})"),
              flush=True)

    def _start_system_metrics(self, cfg: Config) -> None:
        """CPU, memory, disk, network and GPU use every 10 s (MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL),
        where tracking.system_metrics or MLflow's own switch (MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING) asks."""
        from mlflow.environment_variables import (
            MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING,
            MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL,
        )

        if self.run_id is None or not (cfg.tracking.system_metrics or MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get()):
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.system = SystemMetricsMonitor(self.run_id, MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or 10,
                                           resume_logging=self.logged_up_to > 0,
                                           tracking_uri=self.client.tracking_uri)
        self.system.start()

    def _start(self, cfg: Config, parameters: int | None, resumed: bool) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient

        out = Path(cfg.output_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        local = cfg.tracking.uri is None
        uri = f"sqlite:///{local_store(out)}" if local else cfg.tracking.uri
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(cfg.tracking.experiment)
        if experiment is None:  # a server keeps artifacts where it is configured to; a local store beside it
            location = (out / ARTIFACTS).as_uri() if local else None
            experiment_id = self.client.create_experiment(cfg.tracking.experiment, artifact_location=location,
                                                          tags=EXPERIMENT_KIND)
        else:
            experiment_id = experiment.experiment_id
            refuse_outside(local and artifacts_outside(out, experiment.artifact_location,
                                                       f"experiment {experiment.name!r}"))
        id_file = out / RUN_ID_FILE
        if id_file.is_file() and not resumed:
            self._leave_dead_launchs_run(id_file.read_text().strip())
        elif id_file.is_file():
            run_id = id_file.read_text().strip()
            try:
                run = self.client.get_run(run_id)
            except Exception as err:  # noqa: BLE001
                _warn(f"the MLflow run {run_id} named in {id_file} is not in the store ({_first_line(err)}); "
                      "starting a new MLflow run")
            else:
                refuse_outside(local and artifacts_outside(out, run.info.artifact_uri, f"run {run_id}"))
                self.client.update_run(run_id, status="RUNNING")
                self.run_id = run_id
                self._say_where(run)
                return
        # one name per run, kept by the launches that resume its checkpoints (they continue this MLflow run)
        run = self.client.create_run(experiment_id, run_name=f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                                     tags=run_tags(cfg, parameters))
        self.run_id = run.info.run_id
        self._say_where(run)
        self._log_config(cfg, out)
        replace_text(id_file, self.run_id + "\n")

    def _leave_dead_launchs_run(self, run_id: str) -> None:
        """The run of a launch that saved no checkpoint this launch starts from: nothing of it is
        continued (its params, config and steps are not this launch's), so it ends as KILLED if it
        was left RUNNING, and this launch starts a run of its own."""
        try:
            run = self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - not in this store: nothing to end
            return
        if run.info.status == "RUNNING":
            self.client.set_terminated(run_id, status="KILLED")
        print(f"[train] MLflow run {run.info.run_name} was a launch that left no checkpoint to resume; this launch "
              "starts a run of its own", flush=True)

    def _log_config(self, cfg: Config, out: Path) -> None:
        from mlflow.entities import Param

        assert self.run_id is not None  # set just before
        params = [Param(k, v) for k, v in config_params(cfg).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        if cfg.task.kind == "language_model" and cfg.data.prefixes:
            self.client.log_inputs(self.run_id, datasets=dataset_inputs(cfg))
        self.client.log_artifact(self.run_id, str(out / RUN_CONFIG))  # written by the trainer

    def _record_launch(self, cfg: Config, world_size: int, step: int) -> None:
        """This launch as launch n of the run: params launch.<n>.* (launch_record), the tags `config`,
        `world_size`, `zero_stage` and `launches` of the newest, and its config.yaml as the artifact
        launches/<n>/config.yaml (the run's own config.yaml is its first launch's)."""
        from mlflow.entities import Param, RunTag

        if self.run_id is None:
            return
        params = self.client.get_run(self.run_id).data.params
        n = 1 + sum(1 for key in params if key.startswith("launch.") and key.endswith(".world_size"))
        record = launch_record(cfg, world_size, step)
        tags = {"config": record["config"], "world_size": record["world_size"], "zero_stage": record["zero_stage"],
                "launches": str(n)}
        self.client.log_batch(self.run_id, params=[Param(f"launch.{n}.{k}", v) for k, v in record.items()],
                              tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.log_artifact(self.run_id, str(Path(cfg.output_dir).resolve() / RUN_CONFIG), f"launches/{n}")

    def begin(self, step: int, parameters: int | None = None, resumed: bool = False, world_size: int = 1) -> None:
        """Training starts at `step`; `resumed`: from a checkpoint of this run's own folder. The MLflow
        run opens (the run this folder names, continued, where resumed; else a new one), and the
        dashboards open, a resumed one continuing its curves, any other dropping what a dead launch
        drew after `step`."""
        self._open(self.cfg, step, parameters, resumed, world_size)
        if self.active:
            self.dashboards.start(self.cfg, step, resumed)

    def set_phase(self, name: str | None) -> None:
        """The curriculum phase being trained, as the run's `phase` tag (set when it changes)."""
        if name == self.phase or self.run_id is None:
            return
        self.phase = name
        try:
            self.client.set_tag(self.run_id, "phase", name or "")
        except Exception as err:  # noqa: BLE001
            _warn(f"MLflow could not record the phase ({_first_line(err)})")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.dashboards.log(metrics, step)
        if self.run_id is None or step <= self.logged_up_to:  # sent before a kill and the resume that redid it
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        try:
            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])
        except Exception as err:  # noqa: BLE001 - a full disk or a lost server must not end the training
            _warn(f"MLflow logging stopped at step {step} ({_first_line(err)}); metrics.jsonl keeps every metric")
            self.run_id = None

    def finish(self, status: str = "FINISHED") -> None:
        """The run's end (FINISHED, KILLED or FAILED), recorded first and with Ctrl-C held off, so
        that a second Ctrl-C while the dashboards close cannot leave the run RUNNING."""
        with _interrupts_held():
            if self.system is not None:
                self.system.finish()
                self.system = None
            if self.run_id is not None:
                try:
                    self.client.set_terminated(self.run_id, status=status)
                except Exception as err:  # noqa: BLE001
                    _warn(f"MLflow could not record the run's end ({_first_line(err)})")
        self.dashboards.finish(status)


@contextlib.contextmanager
def _interrupts_held():
    """SIGINT held (delivered on leaving) on the main thread; elsewhere nothing to hold."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
