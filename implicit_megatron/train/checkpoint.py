"""DeepSpeed checkpoints with our client state, an atomic `latest`, and the last N kept.

Layout: {output_dir}/checkpoints/{tag}/ (DeepSpeed's files + rng_rank{r}.pt) and
{output_dir}/checkpoints/latest, a one-line file naming the newest *complete* tag. A tag is
written as `.partial-{tag}` and renamed once every rank has finished; `latest` is replaced
(write, fsync, rename) after that, so a kill while a checkpoint is written leaves `latest` on the
previous complete one and no partial folder under a real name (the next start removes it).
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from implicit_megatron.config import Config
from implicit_megatron.train.handoff import UNIVERSAL, Source, read_client_state, write_latest
from implicit_megatron.train.integrity import step_of, tags_by_step

UNIVERSAL_INFO = "universal_checkpoint_info"
CRASH_BEFORE_LATEST = "IMPLICIT_MEGATRON_CRASH_BEFORE_LATEST"  # a tag: exit after writing it, before `latest`
PARTIAL = ".partial-"  # a tag is written under this prefix and renamed when every rank has finished


def checkpoint_dir(cfg: Config) -> Path:
    return Path(cfg.output_dir) / "checkpoints"


def data_signature(cfg: Config) -> dict:
    """What fixes the order of samples: a resume that changes it would repeat or skip data."""
    d = cfg.data
    return {"prefixes": list(d.prefixes), "weights": d.weights, "seq_len": d.seq_len, "seed": d.seed,
            "global_batch_size": cfg.train.global_batch_size, "steps": cfg.train.steps}  # see _check_data_signature


def save(engine, cfg: Config, tag: str, client_state: dict) -> Path:
    """Save on every rank; move `latest` once all ranks are done; prune beyond keep_last."""
    folder = checkpoint_dir(cfg)
    client_state = {**client_state, "config": cfg.to_dict(), "data_signature": data_signature(cfg),
                    # lets DeepSpeed's ds_to_universal convert it (pure data parallelism: no TP/PP patterns)
                    UNIVERSAL_INFO: {"universal_checkpoint_version": 0.4}}
    rank, partial = dist.get_rank(), PARTIAL + tag
    if rank == 0:
        shutil.rmtree(folder / partial, ignore_errors=True)
    dist.barrier()
    engine.save_checkpoint(str(folder), tag=partial, client_state=client_state, save_latest=False)
    torch.save(_rng_state(), folder / partial / f"rng_rank{rank}.pt")
    dist.barrier()
    if os.environ.get(CRASH_BEFORE_LATEST) == tag:  # fault injection for the tests: die as a kill would
        os._exit(137)
    if rank == 0:  # every rank has written: the tag gets its real name, then `latest` names it
        if (folder / tag).exists():  # an older copy of this step (e.g. damaged, left by a fallback)
            shutil.rmtree(folder / tag)
        os.replace(folder / partial, folder / tag)
        write_latest(folder, tag)
        _prune(folder, cfg.checkpoint.keep_last, latest=tag)
    dist.barrier()
    return folder / tag


def remove_partial(cfg: Config, log) -> None:
    """Remove the partial tag folders a kill during a save left (rank 0, before anything starts)."""
    folder = checkpoint_dir(cfg)
    for leftover in sorted(folder.glob(PARTIAL + "*")) if folder.is_dir() else []:
        shutil.rmtree(leftover, ignore_errors=True)
        log(f"removed {leftover}, a checkpoint whose save was interrupted")


def load(engine, cfg: Config, source: Source, fingerprint=None) -> dict:
    """Load `source` (see handoff.find_source) into the engine; returns the client state.

    A resume restores everything; a handoff or a start from checkpoint.load restores what
    checkpoint.load_* ask for. Weights-only starts were loaded into the model before the engine
    was built (handoff.consolidated_weights), so only the client state is read here.
    """
    if source.how == "pretrained":
        return {"loaded_from": str(source.folder)}
    if source.how == "weights":
        client_state = read_client_state(source.path)
    else:
        folder, tag = (source.path, UNIVERSAL) if source.how == "universal" else (source.folder, source.tag)
        # The optimizer's hyperparameters come from this run's config (DeepSpeed's ZeRO-3 universal
        # load would give every parameter group the first group's weight decay); the LR is set per step.
        groups = [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]
        _, client_state = engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                                 load_lr_scheduler_states=False)
        if client_state is None:
            raise RuntimeError(f"{source.path}: DeepSpeed could not load this checkpoint")
        for group, settings in zip(engine.optimizer.param_groups, groups):
            group.update(settings)
    if source.load_data_state:
        client_state["extended"] = _check_data_signature(cfg, client_state, source.path, fingerprint)
    rng = source.path / f"rng_rank{dist.get_rank()}.pt"
    if source.resuming and source.saved.world_size == dist.get_world_size() and rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    client_state["loaded_from"] = str(source.path)
    return client_state


def _check_data_signature(cfg: Config, client_state: dict, where: Path, fingerprint=None) -> bool:
    """Refuse a resume that changes the data order. Raising train.steps alone (extending the run) is
    accepted when the samples already seen come in the same order in the data of the new length:
    `fingerprint(n)` (the task's digest of the order of its first n samples) must equal the one
    saved with the checkpoint. Returns whether the run was extended."""
    saved = client_state.get("data_signature", {})
    now = data_signature(cfg)
    changed = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
    consumed = int(client_state.get("consumed_samples", 0))
    if set(changed) == {"steps"} and fingerprint is not None and "data_fingerprint" in client_state:
        if fingerprint(consumed) == client_state["data_fingerprint"]:
            return True
        before, after = changed["steps"]
        changed["steps"] = (before, f"{after} (the samples already seen come in another order at this length)")
    if changed and not cfg.checkpoint.allow_data_change:
        detail = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise ValueError(f"{where}: resuming with a changed data order ({detail}) would repeat or skip samples; "
                         "restore those settings or set checkpoint.allow_data_change=true")
    return False


def _prune(folder: Path, keep_last: int, latest: str) -> None:
    """Keep the newest `keep_last` checkpoints up to `latest` (a newer one, left behind by a fallback
    from a damaged checkpoint, is replaced when training reaches its step again)."""
    newest = step_of(latest)
    tags = sorted((folder / t for t in tags_by_step(folder) if step_of(t) <= newest), key=lambda p: step_of(p.name))
    for old in tags[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
