"""TensorBoard and Weights & Biases: the metrics MLflow gets, for those who look there instead.

    tracking.tensorboard: true                       <output_dir>/tensorboard/ (torch's SummaryWriter)
    tracking.wandb: {project: NAME, mode: offline}   <output_dir>/wandb/ (`wandb sync` uploads it later)

Both continue a resumed run (a launch from a checkpoint of its own folder): TensorBoard drops the
points of the steps a launch trains again (purge_step; for a launch from step 0, every point an
earlier launch drew), and W&B resumes the run whose id the output folder keeps and plots against the
trainer's step (its own step counter must only grow, which a resume's repeated steps would break);
any other launch starts a W&B run of its own.
A writer that fails warns once and stops; the run goes on (metrics.jsonl keeps every metric).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, cast

from implicit_megatron.utils.safe_write import replace_text

WANDB_RUN_ID_FILE = "wandb_run_id"
STEP = "trainer/step"


def _warn(message: str) -> None:
    print(f"[train] warning: {message}", flush=True)


class TensorBoard:
    def __init__(self, folder: Path, first_step: int) -> None:  # first_step: where this launch starts (0-based)
        from torch.utils.tensorboard import SummaryWriter

        # The writer opens its file in a thread of its own, whose failure is a traceback on stderr,
        # not an error here: find out first, in this thread, whether the folder takes files.
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        # this launch's first step replaces what an interrupted launch wrote from there on
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=first_step + 1)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def finish(self, status: str) -> None:
        self.writer.close()


class WeightsAndBiases:
    def __init__(self, out: Path, name: str, project: str, mode: str, entity: str | None, config: dict,
                 resumed: bool) -> None:
        import wandb

        id_file = out / WANDB_RUN_ID_FILE
        run_id = id_file.read_text().strip() if resumed and id_file.is_file() else secrets.token_hex(4)
        self.run = wandb.init(project=project, entity=entity, mode=cast(Any, mode), dir=str(out), id=run_id, name=name,
                              resume="allow", config=config, settings=wandb.Settings(silent=True))
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        replace_text(id_file, run_id + "\n")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({STEP: step, **metrics})

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status in ("FINISHED", "KILLED") else 1)


class Dashboards:
    """The dashboards a config asks for, on rank 0."""

    def __init__(self) -> None:
        self.writers: list = []

    def start(self, cfg, first_step: int, resumed: bool) -> None:
        out = Path(cfg.output_dir)
        t = cfg.tracking
        wanted = [("TensorBoard", t.tensorboard, lambda: TensorBoard(out / "tensorboard", first_step)),
                  ("Weights & Biases", t.wandb.project is not None,
                   lambda: WeightsAndBiases(out, cfg.name, t.wandb.project, t.wandb.mode, t.wandb.entity,
                                            cfg.to_dict(), resumed))]
        for label, on, make in wanted:
            if on:
                try:
                    self.writers.append(make())
                except Exception as err:  # noqa: BLE001 - a dashboard must never stop a run
                    _warn(f"{label} is off for this launch ({type(err).__name__}: {err}); metrics.jsonl keeps "
                          "every metric")

    def log(self, metrics: dict[str, float], step: int) -> None:
        for writer in list(self.writers):
            try:
                writer.log(metrics, step)
            except Exception as err:  # noqa: BLE001
                _warn(f"{type(writer).__name__} stopped at step {step} ({type(err).__name__}: {err})")
                self.writers.remove(writer)

    def finish(self, status: str) -> None:
        for writer in self.writers:
            try:
                writer.finish(status)
            except Exception as err:  # noqa: BLE001
                _warn(f"{type(writer).__name__} could not close ({type(err).__name__}: {err})")
        self.writers = []
