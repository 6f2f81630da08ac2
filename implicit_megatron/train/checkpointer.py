"""The trainer's checkpoints: where a launch starts from, resuming into the engine, and saving.

Where the files go and what makes a tag complete is implicit_megatron.checkpoints (layout,
integrity); which checkpoint a launch starts from is train/handoff.py's decision, and how each kind
of start loads is train/starts.py's. Here: the start prepared in order before the engine exists
(rank 0's choice given to every rank, then its kind's work), the load into the engine (its kind's,
then the RNG; the parts of the run, train/run_state.py, take theirs back; refused when the data
order changed), and the save of what the parts give: the engine's files into `.partial-{tag}` on
every rank, then the manifest, the rename and `latest` once all are done, and pruning.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.integrity import write_manifest
from implicit_megatron.checkpoints.layout import (
    PARTIAL,
    DamagedCheckpoint,
    Layout,
    checkpoint_dir,
    prune,
    read_latest,
    tag_dir,
    write_latest,
)
from implicit_megatron.checkpoints.safe_load import UnsafeCheckpoint
from implicit_megatron.config import Config
from implicit_megatron.deepspeed_internals import UNIVERSAL_INFO, engine_writes_wrapped
from implicit_megatron.errors import RunRefused, RunStopped
from implicit_megatron.tracking.metrics_file import drop_metrics_after
from implicit_megatron.tracking.run_record import git_state
from implicit_megatron.train.handoff import OwnStart, read_own_start
from implicit_megatron.train.run_state import DataPosition, RngState, gathered
from implicit_megatron.train.starts import Start, find_source, nonfinite_weights
from implicit_megatron.utils.safe_write import OUT_OF_ROOM, room_cause_of


class CheckpointSaveError(RunStopped):
    """A save that failed (full disk, permissions): the run stops, `latest` is untouched."""


def refuse_nonfinite_weights(module: torch.nn.Module, folder: Path, tag: str) -> None:
    """Never save weights that are not finite: every rank agrees, and the run stops naming the tensors
    and the checkpoint `latest` keeps (a resume from it goes back to finite weights)."""
    bad = nonfinite_weights(module)
    flag = torch.tensor([float(bool(bad))], device=next(module.parameters()).device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        previous = read_latest(folder)
        kept = f"'latest' still names {folder / previous}" if previous else "no earlier checkpoint exists"
        names = f" ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''} on rank {dist.get_rank()})" if bad else ""
        raise CheckpointSaveError(f"checkpoint {tag} not saved: the weights hold values that are not finite (NaN or "
                                  f"inf){names}; {kept}")


def _why_save_failed(err: Exception, partial: Path) -> str:
    """One line: the cause (the OS's words, or a full disk or a file-size limit that torch reports
    without them: safe_write.room_cause_of) and the file this rank was writing (`filename`, as
    `_written_to` records it)."""
    where = getattr(err, "filename", None) or partial
    if isinstance(err, OSError) and err.errno is not None and err.errno not in OUT_OF_ROOM:
        cause = err.strerror
    else:
        cause = room_cause_of(err, partial.parent, where) or str(err).strip().splitlines()[0]
    return f"{cause} (writing {where})"


def _written_to(err: Exception, target) -> Exception:
    """`err` with the file it came from as its `filename`: torch reports a failed write without one,
    and the newest file of the folder may be another rank's."""
    if getattr(err, "filename", None) is None and target is not None:
        err.filename = str(target)  # type: ignore[attr-defined]
    return err


@contextlib.contextmanager
def writes_recorded(engine, failures: list[Exception]):
    """DeepSpeed's file writes of a save record their failure in `failures` instead of raising (and
    write nothing more). Raised out of engine.save_checkpoint, a failed write skips DeepSpeed's own
    barriers on this rank while the others wait at them, and the job hangs (a full disk under ZeRO-0,
    where rank 0 alone writes); recorded, every rank goes through them and the ranks then agree on
    the failure."""
    def recorded(write):
        def attempt(*args, **kwargs):
            if failures:
                return None
            try:
                return write(*args, **kwargs)
            except (OSError, RuntimeError) as err:
                target = next((a for a in (*args, *kwargs.values()) if isinstance(a, (str, os.PathLike))), None)
                failures.append(_written_to(err, target))
                return None
        return attempt

    with engine_writes_wrapped(engine, recorded):
        yield


def data_signature(cfg: Config) -> dict:
    """What fixes the order of samples: a resume that changes it would repeat or skip data."""
    d = cfg.data
    return {"prefixes": list(d.prefixes), "weights": d.weights, "seq_len": d.seq_len, "seed": d.seed,
            "global_batch_size": cfg.train.global_batch_size, "steps": cfg.train.steps}  # see _check_data_signature


def save(engine, cfg: Config, tag: str, client_state: dict, val_loss: float | None = None,
         before_latest: Callable[[str], None] | None = None, log=print) -> Path:
    """Save on every rank; move `latest` once all ranks are done; prune beyond keep_last (never the
    checkpoint with the best validation loss; `val_loss` is these weights', where known).
    `before_latest(tag)` runs when every rank has written, before the rename (callbacks)."""
    folder = checkpoint_dir(cfg)
    tag = tag_dir(folder, tag).name  # a plain name: the folders below never leave `folder`
    client_state = {**client_state, "config": cfg.to_dict(), "data_signature": data_signature(cfg),
                    "git_commit": git_state().get("commit"),  # the code that trained it, where a git checkout
                    # lets DeepSpeed's ds_to_universal convert it (pure data parallelism: no TP/PP patterns)
                    UNIVERSAL_INFO: {"universal_checkpoint_version": 0.4}}
    rank, partial = dist.get_rank(), PARTIAL + tag
    refuse_nonfinite_weights(engine.module, folder, tag)
    if rank == 0:
        shutil.rmtree(folder / partial, ignore_errors=True)
    dist.barrier()
    failure = None
    failed_writes: list[Exception] = []
    try:
        with writes_recorded(engine, failed_writes):
            engine.save_checkpoint(str(folder), tag=partial, client_state=client_state, save_latest=False)
        if failed_writes:
            raise failed_writes[0]
        rng_file = folder / partial / f"rng_rank{rank}.pt"
        try:
            torch.save(RngState().state_dict(), rng_file)
        except (OSError, RuntimeError) as err:
            raise _written_to(err, rng_file) from None
    except (OSError, RuntimeError) as err:  # torch reports a full disk as a RuntimeError without errno
        failure = _why_save_failed(err, folder / partial)
    failed = torch.tensor([failure is not None], dtype=torch.float64)
    dist.all_reduce(failed)  # every rank stops together; none waits at a barrier for a rank that failed
    if failed.item():
        if rank == 0:
            shutil.rmtree(folder / partial, ignore_errors=True)
        previous = read_latest(folder)
        kept = f"'latest' still names {folder / previous}, the previous complete checkpoint" if previous else \
            "no earlier checkpoint exists"
        raise CheckpointSaveError(f"checkpoint {tag} could not be saved into {folder}: "
                                  f"{failure or 'another rank failed to write its files'}; {kept}")
    if before_latest is not None:
        before_latest(tag)
    if rank == 0:  # every rank has written: a manifest, the tag's real name, then `latest` names it
        write_manifest(folder / partial, val_loss)
        if (folder / tag).exists():  # an older copy of this step (e.g. damaged, left by a fallback)
            shutil.rmtree(folder / tag)
        os.replace(folder / partial, folder / tag)
        write_latest(folder, tag)
        prune(folder, cfg.checkpoint.keep_last, latest=tag, log=log)
    dist.barrier()
    return folder / tag


def load(engine, cfg: Config, source: Start, fingerprint=None) -> dict:
    """Load `source` (see starts.find_source) into the engine; returns the client state.

    Its kind loads what it holds (Start.into_engine: DeepSpeed's load, or nothing where the weights
    went into the model before the engine was built); then what every start restores alike: the
    data position where asked (refused when the data order changed) and, for a resume at the same
    world size, the RNG.
    """
    client_state = source.into_engine(engine, cfg)
    if source.load_data_state:
        client_state["extended"] = _check_data_signature(cfg, client_state, source.path, fingerprint)
    rng = source.path / f"rng_rank{dist.get_rank()}.pt"
    if source.resuming and cast(Layout, source.saved).world_size == dist.get_world_size() and rng.is_file():
        RngState().load_state_dict(safe_load.load(rng))
    client_state["loaded_from"] = str(source.path)
    return client_state


def _check_data_signature(cfg: Config, client_state: dict, where: Path, fingerprint=None) -> bool:
    """Refuse a resume that changes the data order. Raising train.steps alone (extending the run) is
    accepted when the samples already seen come in the same order in the data of the new length:
    `fingerprint(n)` (the task's digest of the order of its first n samples) must equal the one
    saved with the checkpoint. With the settings unchanged, it must too: shards rebuilt in place
    (their source changed) would otherwise be read from the old position. Returns whether the run
    was extended."""
    saved = client_state.get("data_signature", {})
    now = data_signature(cfg)
    changed = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
    consumed = int(client_state.get("consumed_samples", 0))
    same_samples = None  # whether the samples already seen are those the checkpoint saw (None: unknown)
    if fingerprint is not None and "data_fingerprint" in client_state and consumed \
            and not cfg.checkpoint.allow_data_change:
        same_samples = fingerprint(consumed) == client_state["data_fingerprint"]
    if "steps" in changed and consumed > cfg.train.steps * cfg.train.global_batch_size:
        before, after = changed["steps"]
        changed["steps"] = (before, f"{after} (fewer samples than the checkpoint has already seen)")
    elif set(changed) == {"steps"} and same_samples is not None:
        if same_samples:
            return True
        before, after = changed["steps"]
        changed["steps"] = (before, f"{after} (the samples already seen come in another order at this length)")
    elif not changed and same_samples is False:
        changed["data"] = ("the samples this checkpoint has seen", "others (the shards under data.prefixes, or the "
                                                                    "data.source they were built from, changed)")
    if changed and not cfg.checkpoint.allow_data_change:
        detail = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise RunRefused(f"{where}: resuming with a changed data order ({detail}) would repeat or skip samples; "
                         "restore those settings or set checkpoint.allow_data_change=true")
    return False


class Checkpointer:
    """The trainer's side of its checkpoints, in the order a launch needs them: `prepare` before
    the engine exists (rank 0 chooses the start, a universal checkpoint must be named in DeepSpeed's
    config, weights-only starts fill the model the engine then partitions), `resume` into the
    engine, `save` at each checkpoint."""

    def __init__(self, cfg: Config, rank: int, world: int, log, before_latest: Callable[[str], None]) -> None:
        self.cfg, self.rank, self.world, self.log, self.before_latest = cfg, rank, world, log, before_latest
        self.source: Start | None = None
        self.run_id: str | None = None  # this run's (checkpoints.layout.own_run_id), set by prepare

    def prepare(self, model: torch.nn.Module) -> Start | None:
        """Find the checkpoint to start from, and do what its kind needs before the engine exists (a
        universal conversion, its weights into the model)."""
        # rank 0 reads the checkpoint files once; every rank starts from its choice
        shared: list[OwnStart | None] = [read_own_start(self.cfg, self.log) if self.rank == 0 else None]
        dist.broadcast_object_list(shared, src=0)
        own = cast(OwnStart, shared[0])
        if own.error:
            raise RunRefused(f"checkpoint error: {own.error}")
        self.run_id = own.run_id
        try:
            source = self.source = find_source(self.cfg, self.world, own.tag)
        except (DamagedCheckpoint, UnsafeCheckpoint, FileNotFoundError) as err:  # checkpoint.load's, named
            raise RunRefused(f"checkpoint error: {err}") from None
        if source is None:
            return None
        self.log(f"starting from {source.describe()}")
        source.before_engine(model, self.cfg, self.rank, self.log)
        return source

    @property
    def from_own_folder(self) -> bool:
        """This launch starts from a checkpoint of its own folder (a resume, or the next phase of a
        curriculum trained in one folder): it continues the run's records. Any other start is a run
        of its own, whatever a launch that died before saving left in the folder."""
        return self.source is not None and self.source.folder == checkpoint_dir(self.cfg)

    def resume(self, engine, progress, data: DataPosition) -> dict | None:
        """Load the prepared start into the engine, and give the step and samples back to `progress`
        and (as checkpoint.load_data_state says) the position to `data`. Returns the client state
        (None for a fresh start), from which the loop's callbacks take theirs (Hooks.resume). The
        step, and with it the LR schedule, continues across a handoff."""
        source = self.source
        if source is None:
            self._drop_records_after(0)  # of a launch that died before its first checkpoint
            return None
        state = load(engine, self.cfg, source, fingerprint=data.fingerprint)
        if "step" in state:  # a start without a client state (a model folder) starts at step 0
            if source.resuming or self.cfg.curriculum.run_phase is not None or source.load_data_state:
                progress.load_state_dict(state)
            if source.load_data_state:
                if self.cfg.checkpoint.allow_data_change or state.get("extended"):  # the index was rebuilt
                    data.load_state_dict({"data": {"consumed_samples": state["data"]["consumed_samples"]}})
                else:
                    data.load_state_dict(state)
                if state.get("extended"):
                    self.log(f"train.steps raised to {self.cfg.train.steps}: the {progress.consumed_samples} samples "
                             "already seen come in the same order; extending the run")
        self.log(f"loaded {state['loaded_from']} at step {progress.step} ({progress.consumed_samples} samples)")
        self._drop_records_after(progress.step)
        return state

    def _drop_records_after(self, step: int) -> None:
        """(Rank 0) metrics.jsonl keeps no record of a step this launch trains again."""
        redone, damaged = drop_metrics_after(self.cfg.output_dir, step) if self.rank == 0 else ([], 0)
        if redone:
            self.log(f"metrics.jsonl: removed the records of steps {redone[0]}-{redone[-1]}, which this launch "
                     "trains again")
        if damaged:
            self.log(f"warning: {Path(self.cfg.output_dir) / 'metrics.jsonl'}: dropped {damaged} line(s) that were no "
                     "whole record (cut by a kill, not UTF-8, or without an integer step)")

    def save(self, engine, parts: list, tag: str, val_loss: float | None) -> str:
        """A checkpoint of this step holding what `parts` give (run_state.gathered); returns the tag."""
        path = save(engine, self.cfg, tag, {"run_id": self.run_id, **gathered(parts)}, val_loss, self.before_latest,
                    self.log)
        self.log(f"saved {path}")
        return tag
