"""Per-rank entry: python -m implicit_megatron.train CONFIG [key=value ...].

Exit status: 0 when the run finished or stopped gracefully (a stop signal: see docs/training.md), 2
when the launch was refused (a bad config, a held output folder, a checkpoint that does not fit: one
line from rank 0, no traceback), 1 on a failure (with its traceback), 3 when its launch is gone.
However it ends, once its output folder is known, rank 0 writes the run's end there
(run_control.RunEnd, here and nowhere else), which the launch reads.
"""

from __future__ import annotations

import argparse
import base64
import faulthandler
import functools
import os
import sys
from pathlib import Path

from implicit_megatron.errors import ORPHANED, REFUSED, first_line
from implicit_megatron.prelaunch import load_config
from implicit_megatron.run_control import Launch, RunEnd
from implicit_megatron.train import stopping
from implicit_megatron.train.process import quiet
from implicit_megatron.utils.ports import free_port
from implicit_megatron.utils.typed_yaml import ConfigError, dashed_override

ENCODED = "--args-base64"  # the launch's form on several nodes (launch/command.py): CONFIG and overrides, NUL-ended


def decoded(argv: list[str]) -> list[str]:
    """The arguments themselves, where the launch sent them as `--args-base64 WORD` through a
    remote shell (which would split or run them as they are); any other form as it is."""
    rest = [a for a in argv if not a.startswith(("--local_rank", "--local-rank"))]  # a launcher may add it
    if len(rest) != 2 or rest[0] != ENCODED:
        return argv
    return base64.b64decode(rest[1], validate=True).decode().split("\0")[:-1]


def main(argv: list[str] | None = None) -> int:
    argv = decoded(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m implicit_megatron.train", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train one rank of a run: started by launch/pretrain.sh, torchrun, the DeepSpeed\n"
                    "launcher or srun; run directly, it is a world of one process.",
        epilog="Every config key, its type, default and meaning: docs/config.md.\n"
               "Check a config before launching: python -m implicit_megatron.config CONFIG [key=value ...]\n"
               "Examples: configs/quickstart.yaml, configs/{mamba2,llama}/{size}-implicit.yaml")
    parser.add_argument("config", metavar="CONFIG", nargs="?", help="the run's YAML file (with its base: chain)")
    parser.add_argument("overrides", metavar="key=value", nargs="*",
                        help="optional dotted overrides, e.g. train.steps=100 implicit.cuda_graphs=off")
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # LOCAL_RANK is used
    dashed = dashed_override(sys.argv[1:] if argv is None else argv)
    if dashed:
        print(f"python -m implicit_megatron.train: error: {dashed}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.config is None:
        parser.error("a config file is required, e.g. configs/quickstart.yaml (overrides are optional)")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    faulthandler.enable()  # a fatal signal (SIGBUS from a file cut under a memory map) prints where it came
    stopping.signals()  # taken once, for the whole process
    output_dir_seen: list[str] = []
    try:
        end = _run(args, output_dir_seen.append)
    except stopping.StoppedDuringStartUp:
        end = RunEnd("stopped", 0, reason=f"{stopping.requested() or 'SIGTERM'} during start-up")
        _speak(f"[train] stopped by {end.reason}, before the first step: nothing was trained or saved; launch "
               "again to resume")
    except BaseException as err:
        if not isinstance(err, (KeyboardInterrupt, SystemExit)) and output_dir_seen and output_dir_seen[-1]:
            _record(output_dir_seen[-1], RunEnd("failed", 1, reason=first_line(err)))
        raise
    if output_dir_seen and output_dir_seen[-1]:
        _record(output_dir_seen[-1], end)
    return end.exit_status


def _first() -> bool:
    """Rank 0: the rank that speaks for all, and writes the run's end."""
    return int(os.environ.get("RANK", "0")) == 0


def _speak(line: str, err: bool = False) -> None:
    if _first():
        print(line, file=sys.stderr if err else sys.stdout, flush=True)


def _record(output_dir: str, end: RunEnd) -> None:
    """The run's end, for the launch (rank 0; a folder it cannot write keeps the exit status alone)."""
    if _first():
        try:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            end.write(Path(output_dir))
        except OSError as err:
            _speak(f"[train] warning: the run's end could not be recorded in {output_dir} ({err.strerror or err})",
                   err=True)


def _run(args, seen_output) -> RunEnd:
    quiet.settle(int(os.environ.get("RANK", "0")))
    try:
        cfg = load_config(args.config, args.overrides, world_size=int(os.environ.get("WORLD_SIZE", "1")),
                          check_data=True)
    except ConfigError as err:
        _speak(f"config error: {err}", err=True)
        return RunEnd("refused", REFUSED, reason=f"config error: {err}")
    seen_output(cfg.output_dir)
    if "LOCAL_RANK" in os.environ:  # started by a launcher: end with it (a kill -9 leaves no one to stop us)
        _exit_with_launcher(os.getppid(), cfg.output_dir, _tracked_run(cfg) if _first() else None)
    if "RANK" not in os.environ:  # a plain `python -m` run: a world of one process, on a free port
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT") or str(free_port()))
    rank = int(os.environ["RANK"])
    from implicit_megatron.train.process.run_lock import RunLock, RunLocked

    try:  # rank 0 takes the output folder before anything is written to it
        lock = RunLock.acquire(cfg.output_dir, log=lambda line: print(f"[train] {line}", flush=True)) \
            if rank == 0 else None
    except (RunLocked, OSError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        seen_output(None)  # the folder is another run's: nothing is written into it
        return RunEnd("refused", REFUSED, reason=str(err))
    try:
        stopping.check()
    except stopping.StoppedDuringStartUp:
        if lock is not None:
            lock.release()
        raise
    from implicit_megatron.errors import RunRefused, RunStopped
    from implicit_megatron.train.loop import Trainer

    try:
        end = Trainer(cfg).fit()
        _leave_process_group()
        return end
    except RunRefused as err:  # every rank refuses together: the group can be torn down as after a run
        _speak(f"error: {err}", err=True)
        _leave_process_group()
        return RunEnd("refused", REFUSED, reason=str(err))
    except RunStopped as err:  # its message says everything: no traceback
        _speak(f"error on rank {rank}: {type(err).__name__}: {err}", err=True)
        return RunEnd("failed", 1, reason=str(err))
    except Exception as err:  # one clear line before the traceback that follows
        from implicit_megatron.train.callbacks.stall import name_timeout

        for end_if_gone in _ORPHAN_CHECK:  # a kill -9 of the launch: the other ranks' watchers ended them first
            end_if_gone()

        line = name_timeout(err, rank, cfg.distributed.collective_timeout_minutes)
        if line is not None:  # a process group's or the store's own timeout: the line says it all
            print(line, file=sys.stderr, flush=True)
            return RunEnd("failed", 1, reason=line)
        print(f"error on rank {rank}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        raise
    finally:
        if lock is not None:
            lock.release()


def _tracked_run(cfg) -> tuple[str, str] | None:
    """(run folder, MLflow store) of this launch, as the tracker will open them (the config's store,
    else MLflow's environment variable, else the folder's own); None when it does not track. Taken
    from this launch's config, never from what the folder holds from before (a folder received
    from someone could name a server of theirs)."""
    if not cfg.tracking.enabled:
        return None
    from implicit_megatron.tracking.tracker import STORE

    folder = Path(cfg.output_dir).resolve()
    return str(folder), cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{folder / STORE}"


def _exit_with_launcher(launcher: int, output_dir: str, tracked_run: tuple[str, str] | None) -> None:
    """torchrun and the DeepSpeed launcher start ranks in sessions of their own, and the launch
    starts the launcher in one of its own, so a kill -9 of the launch's process group leaves them
    training. Watchers end this rank once its launcher, or the launch that started it
    (run_control.Launch) where it runs on this host and this rank can see it, is gone, as
    preprocessing's workers do (the run lock of a dead rank is taken over by the next launch), with
    exit status ORPHANED, which our torchrun says nothing about. The end is said once, in one line:
    by rank 0, which records its MLflow run (`tracked_run`: folder and store) as KILLED first, and the
    run's end."""
    import socket
    import threading

    from data_pipeline.processes import exit_when_gone, process_running, start_ticks

    spoken = threading.Lock()

    launch = Launch.of(os.environ)
    # None: another host's launch, or one this rank cannot see (a container with a process namespace of its own)
    if launch is not None and not (launch.host == socket.gethostname() and
                                   process_running(launch.pid, launch.start_ticks)):
        launch = None

    def last_words(what: str) -> None:
        if not _first() or not spoken.acquire(blocking=False):  # one line, whichever watcher sees it first
            return
        # the launch, alive, says the end itself (launch/supervisor.py: a second Ctrl-C, a killed launcher)
        launch_says = launch is not None and process_running(launch.pid, launch.start_ticks)
        recorded = ""
        if tracked_run is not None:
            from implicit_megatron.tracking.end_run import end_run

            try:
                recorded = f"; {end_run(Path(tracked_run[0]), 'KILLED', tracked_run[1])}"
            except Exception as err:  # noqa: BLE001 - the store may be gone with the launch
                recorded = f"; its MLflow run could not be recorded as KILLED ({type(err).__name__})"
        if not launch_says:
            print(f"[train] {what} is gone (killed): this launch ends here, what was trained since the last "
                  f"checkpoint is lost{recorded}", file=sys.stderr, flush=True)
        _record(output_dir, RunEnd("killed", ORPHANED, reason=f"{what} is gone"))

    watched = {launcher: (start_ticks(launcher), f"the launcher of the ranks (process {launcher})")}
    if launch is not None:
        watched[launch.pid] = (launch.start_ticks, f"launch/pretrain.sh (process {launch.pid})")
    for pid, (_, what) in watched.items():
        exit_when_gone(pid, code=ORPHANED, before_exit=functools.partial(last_words, what))

    def end_if_gone() -> None:
        """A collective that failed because the other ranks, watching, ended first: the cause named."""
        for pid, (ticks, what) in watched.items():
            if not process_running(pid, ticks):
                last_words(what)
                sys.stderr.flush()
                os._exit(ORPHANED)

    _ORPHAN_CHECK[:] = [end_if_gone]


_ORPHAN_CHECK: list = []  # _exit_with_launcher's end_if_gone, once the watchers run


def _leave_process_group() -> None:
    """Tear the process group down before the interpreter does, as torch asks (the stall watch,
    whose threads call into torch's store, has ended by then: train/callbacks/stall.py, StallWatch.done)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
