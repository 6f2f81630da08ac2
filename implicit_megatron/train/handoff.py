"""Which checkpoint a launch starts from: the choice of tag, before its kind (train/starts.py) is known.

A launch starts from (1) its own `latest` checkpoint: a *resume* when that checkpoint belongs to
the phase being run, a *phase handoff* when it ended an earlier phase (`curriculum.run_phase`);
or (2) `checkpoint.load`, another run's checkpoint or a model folder. A resume restores everything
(the optimizer state unless checkpoint.load_optimizer=false); a handoff or a load restores the
weights and, as checkpoint.load_optimizer / load_data_state say, the optimizer state and the data
position. The step count, and with it the LR schedule, always continues across a handoff.

Rank 0 reads this run's own checkpoints once (`read_own_start`: the tag to resume, the run id, or
why the launch cannot start) and every rank starts from that record. `StartContext` is what each kind of
start reads to decide whether it applies; how the layout that saved a tag decides its kind is
train/starts.py's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path

from implicit_megatron.checkpoints.integrity import check_tag, fallback_hint, newest_complete, require_complete
from implicit_megatron.checkpoints.layout import (
    LATEST,
    MODEL_STATES,
    RUN_ID,
    ZERO3_MODEL_STATES,
    DamagedCheckpoint,
    Layout,
    checkpoint_dir,
    own_run_id,
    phase_of,
    read_client_state,
    read_latest,
    remove_partial,
    saved_layout,
    step_of,
    tags_by_step,
    write_latest,
)
from implicit_megatron.checkpoints.safe_load import UnsafeCheckpoint
from implicit_megatron.checkpoints.weights import model_settings_changed
from implicit_megatron.config import Config
from implicit_megatron.errors import RunRefused


def resume_tag(cfg: Config, log) -> str | None:
    """The complete tag of this run's own checkpoints to start from (None: there are none).

    `latest` names it. When `latest` is missing or unreadable while tag folders exist, or names a
    tag that is incomplete or corrupt, the newest complete tag is taken instead, with a warning
    naming the damaged file, and `latest` is rewritten to name it (checkpoint.on_damaged=fail
    refuses instead). Never a fresh start over existing checkpoints. Run by rank 0 only: it reads
    every file of the tag it returns.
    """
    own = checkpoint_dir(cfg)
    try:
        tag, problem = read_latest(own), None
    except DamagedCheckpoint as err:
        tag, problem = None, err
    if tag is not None:
        try:
            check_tag(own / tag)
            return tag
        except DamagedCheckpoint as err:
            problem = err
    if problem is None and not tags_by_step(own):
        return None  # a new run
    if problem is None:
        problem = DamagedCheckpoint(own / LATEST, "is missing although checkpoint folders exist")
    if cfg.checkpoint.on_damaged == "fail":
        raise DamagedCheckpoint(problem.file, f"{problem.problem}; {fallback_hint(own, tag or '')}; "
                                              "checkpoint.on_damaged=fallback would resume from it")
    chosen, damaged = newest_complete(own, before=step_of(tag) if tag else None)
    if chosen is None:
        found = "; ".join(str(d) for d in [problem, *damaged][:3])
        newer = newest_complete(own)[0] if tag else None  # `latest` names an older tag than complete ones
        if newer is not None:
            raise DamagedCheckpoint(problem.file, f"{problem.problem}, and no complete checkpoint older than {tag} is "
                                                  f"in {own}, while newer ones are (the newest: {newer}); point "
                                                  f"{own / LATEST} at the one to resume from")
        raise DamagedCheckpoint(problem.file, f"{problem.problem}, and no complete checkpoint is in {own} "
                                              f"({found}); remove them or choose another train.output_dir "
                                              "to start afresh")
    for damage in [problem, *damaged]:
        log(f"warning: {damage}")
    log(f"warning: resuming from {own / chosen}, the newest complete checkpoint; `latest` now names it")
    write_latest(own, chosen)
    return chosen


def foreign_tag_problem(path: Path, run_id: str) -> str | None:
    """Why the tag at `path`, in this run's own checkpoints, is not this run's (None: it is): another
    run saved it, or the step it holds is not the step its name says (a tag renamed or copied in)."""
    saved = read_client_state(path)
    recorded_step = saved.get("step")
    if recorded_step is not None and recorded_step != step_of(path.name):
        return f"holds step {recorded_step}, not the step its name says"
    recorded_run = saved.get("run_id")
    if recorded_run is not None and recorded_run != run_id:
        return (f"was saved by another run (run id {recorded_run}; this run's is {run_id}, in "
                f"{path.parent / RUN_ID})")
    return None


def refuse_foreign_tag(cfg: Config, tag: str, run_id: str) -> None:
    """RunRefused for a tag of this run's folder that is not this run's, unless accepted explicitly."""
    path = checkpoint_dir(cfg) / tag
    problem = foreign_tag_problem(path, run_id)
    if problem and not cfg.checkpoint.accept_foreign_checkpoint:
        raise RunRefused(f"{path}: {problem}: resuming from it would not continue this run; remove it and point "
                         f"{checkpoint_dir(cfg) / LATEST} at one of this run's checkpoints, start from it with "
                         "checkpoint.load=PATH in a new output folder, or set "
                         "checkpoint.accept_foreign_checkpoint=true")


@dataclass(frozen=True)
class OwnStart:
    """Rank 0's reading of this run's own checkpoints, broadcast to every rank, which all start from it."""

    tag: str | None = None  # this run's own tag to resume from (None: it has none)
    run_id: str | None = None  # this run's id (checkpoints.layout.own_run_id), saved with its checkpoints
    error: str | None = None  # why the launch cannot start (a damaged or foreign checkpoint), for every rank


def read_own_start(cfg: Config, log) -> OwnStart:
    """(Rank 0) Remove the saves a kill interrupted, then choose the tag to resume (`resume_tag`),
    take the run's id and refuse a tag that is not this run's; an error is returned, not raised, so
    that every rank fails with it."""
    remove_partial(cfg, log)
    own = checkpoint_dir(cfg)
    try:
        tag = resume_tag(cfg, log)
        run_id = own_run_id(own, read_client_state(own / tag).get("run_id") if tag else None, log)
        if tag:
            refuse_foreign_tag(cfg, tag, run_id)
    except (DamagedCheckpoint, UnsafeCheckpoint, RunRefused, OSError) as err:
        return OwnStart(error=str(err))
    return OwnStart(tag=tag, run_id=run_id)


@dataclass(frozen=True, kw_only=True)
class Found:
    """A DeepSpeed checkpoint tag to start from, and what of it this launch restores; its kind
    (train/starts.py) follows from `saved` against this launch's layout."""

    folder: Path  # a checkpoints/ folder
    tag: str
    resuming: bool  # this run's own checkpoint, same phase: restore everything
    saved: Layout
    load_optimizer: bool
    load_data_state: bool

    @property
    def path(self) -> Path:
        return self.folder / self.tag

    def keywords(self) -> dict:
        """The fields, as keywords for a start of any kind."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class StartContext:
    """What each kind of start reads to decide whether it applies: the config, this launch's layout,
    this run's own tag to resume (rank 0's `read_own_start`), and the DeepSpeed tag it names or
    checkpoint.load does (`checkpoint`, found once, when a kind first asks)."""

    def __init__(self, cfg: Config, world_size: int, own_tag: str | None) -> None:
        self.cfg, self.own_tag = cfg, own_tag
        self.now = Layout(world_size, cfg.distributed.zero_stage, cfg.distributed.precision)

    @property
    def load_path(self) -> Path | None:
        """checkpoint.load, where this launch has no tag of its own to resume (which comes first)."""
        load = self.cfg.checkpoint.load
        return Path(load) if load and self.own_tag is None else None

    @functools.cached_property
    def checkpoint(self) -> Found | None:
        """The DeepSpeed tag to start from: this run's own, else the one checkpoint.load names (None:
        neither; a model folder is no tag). A checkpoint whose optimizer state is to load must hold a
        model of this config's shape: DeepSpeed's loaders would fail deep inside, or not at all."""
        c = self.cfg.checkpoint
        if self.own_tag is not None:
            run_phase = self.cfg.curriculum.run_phase
            resuming = run_phase is None or phase_of(self.own_tag) in (run_phase, None)
            # A resume restores the data position always, the optimizer state unless load_optimizer=false
            # (a fresh optimizer: the way to resume under a layout its state cannot convert to).
            folder, tag, load_data_state = checkpoint_dir(self.cfg), self.own_tag, resuming or c.load_data_state
        elif self.load_path is not None and (named := _named_checkpoint(self.load_path)) is not None:
            folder, tag = named
            resuming, load_data_state = False, c.load_data_state
        else:
            return None
        found = Found(folder=folder, tag=tag, resuming=resuming, saved=saved_layout(folder / tag),
                      load_optimizer=c.load_optimizer, load_data_state=load_data_state)
        changed = model_settings_changed(found.path, self.cfg) if found.load_optimizer else ""
        if changed:
            raise RunRefused(f"{found.path}: the checkpoint's model does not fit this config's ({changed}); restore "
                             "those settings (its weights and optimizer state load only into a model of the same "
                             "shape)")
        return found


def _named_checkpoint(path: Path) -> tuple[Path, str] | None:
    """The (checkpoints folder, tag) checkpoint.load names: a checkpoints/ folder (its `latest`) or one
    tag folder in it, complete; None when it names neither."""
    tag = read_latest(path)
    if tag is not None:
        return path, require_complete(path, tag)
    if read_latest(path.parent) is not None and any((path / n).is_file() for n in (MODEL_STATES, ZERO3_MODEL_STATES)):
        return path.parent, require_complete(path.parent, path.name)
    return None
