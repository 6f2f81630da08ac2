"""One run per output folder, and the folder its own: a lock file that rank 0 takes before anything
is written, refused while the folder holds a link (not_its_own).

Two runs on one folder would resume from the same checkpoint and interleave their saves (and race
on `latest` and on MLflow's store). `<output_dir>/run.lock` holds the holder's host, process id,
process start time and command. A second run is refused with a message naming the folder and the
holder. A lock whose holder is gone (same host, no such process, or the id now belongs to a newer
process) is stale and taken over with a log line; a lock held on another host cannot be checked
from here, and the message says how to clear it. The lock is released when the run ends.

    python -m implicit_megatron.train.process.run_lock OUTPUT_DIR    (exit 2 naming the holder if in use)

is the check the launch (launch/pretrain.py) makes before it writes anything.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from data_pipeline.processes import process_running, start_ticks
from implicit_megatron.utils.own_files import foreign_entries_inside, tracker_link

LOCK_FILE = "run.lock"


class RunLocked(RuntimeError):
    """Another run holds the output folder."""


def _holder_text(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"host {holder.get('host')}, process {holder.get('pid')}, started {started}: {holder.get('command', '?')}"


def not_its_own(output_dir: str | Path) -> str | None:
    """Why the folder is not a run's own (None: it is): a link inside it (a file or `checkpoints/` of
    a folder copied from elsewhere) would make the run write through it, into another run's
    checkpoints or a file outside, where this lock protects nothing. Every such entry is named at
    once; the links W&B makes in the run's wandb/ folder are the run's own (own_files.tracker_link)."""
    folder = Path(output_dir)
    found = foreign_entries_inside(folder, hard_links=True, accepted=tracker_link(folder))
    if not found:
        return None
    links = [entry for entry in found if "is hard-linked" not in entry]
    advice = []
    if links:
        advice.append("replace each link with the file or folder it points to (to keep a run on another disk, name "
                      "a folder there as train.output_dir)")
    if len(links) < len(found):
        advice.append("copy the run folder with cp -a (not -l) to train on from another run's files")
    return (f"{'; '.join(found)}: a run folder holds its own files only, and this run would write through "
            f"{'it' if len(found) == 1 else 'them'}; {'; '.join(advice)}")


def in_use(output_dir: str | Path) -> str | None:
    """Why the folder cannot be taken now (held by a live run, or by one on another host, or holding
    a link: not_its_own), or None."""
    folder = Path(output_dir)
    if not_its_own(folder):
        return not_its_own(folder)
    path = folder / LOCK_FILE
    holder = RunLock._read(path) if path.exists() else None
    if holder is None:
        return None
    if holder.get("host") != socket.gethostname():
        return (f"{folder} is in use by another run ({_holder_text(holder)}). If that run has ended, remove "
                f"{path} and start again.")
    if process_running(holder["pid"], holder.get("ticks")):
        return f"{folder} is in use by another run ({_holder_text(holder)}); wait for it to end or choose " \
               "another train.output_dir"
    return None


MAX_PID = 2**31 - 1  # pid_t is a signed 32-bit integer; a larger id overflows os.kill


class RunLock:
    def __init__(self, path: Path, holder: dict):
        self.path, self.holder = path, holder

    @classmethod
    def acquire(cls, output_dir: str | Path, log=print) -> RunLock:
        folder = Path(output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOCK_FILE
        me = {"host": socket.gethostname(), "pid": os.getpid(), "ticks": start_ticks(os.getpid()),
              "started": time.time(), "command": " ".join(sys.argv)}
        if not_its_own(folder):
            raise RunLocked(not_its_own(folder))
        for _ in range(5):  # each round: create, or judge the holder and maybe take a stale lock over
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                reason = in_use(folder)
                if reason is not None:
                    raise RunLocked(reason) from None
                holder = cls._read(path)
                what = _holder_text(holder) if holder else "unreadable: damaged, or its starter died writing it"
                cls._take_over(path, holder)
                log(f"{path}: the run that held it has ended ({what}); taken over")
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            return cls(path, me)
        raise RunLocked(f"{folder}: could not take {path}; other runs are starting on this folder")

    @classmethod
    def _take_over(cls, path: Path, stale_holder: dict | None) -> None:
        """Move the stale lock aside; if what was moved is not the lock judged stale (a starter
        replaced it meanwhile), put it back."""
        aside = path.with_name(f"{LOCK_FILE}.stale-{os.getpid()}")
        try:
            os.replace(path, aside)
        except FileNotFoundError:
            return
        if cls._read(aside) != stale_holder:
            os.replace(aside, path)
        else:
            aside.unlink(missing_ok=True)

    @staticmethod
    def _read(path: Path) -> dict | None:
        """The holder, or None for a lock that stays unreadable: its starter died while writing it, or
        it is not a lock this module wrote (no host, no process id of this system's range: damaged or
        edited)."""
        for _ in range(3):
            try:
                holder = json.loads(path.read_bytes().decode("utf-8"))
            except (OSError, ValueError):
                time.sleep(0.1)  # being written right now
                continue
            whole = isinstance(holder, dict) and isinstance(holder.get("host"), str) and \
                type(holder.get("pid")) is int and 0 < holder["pid"] <= MAX_PID
            return holder if whole else None
        return None

    def release(self) -> None:
        """Remove the lock if it is still ours. A folder that became read-only (or vanished) keeps it:
        the next launch finds its process gone and takes the folder over, so this is a note, not an error."""
        holder = self._read(self.path) if self.path.exists() else None
        if holder and holder.get("pid") == self.holder["pid"] and holder.get("host") == self.holder["host"]:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as err:
                print(f"[train] note: {self.path} stays ({err.strerror or err}); the next launch on this host "
                      "takes it over", file=sys.stderr, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m implicit_megatron.train.process.run_lock OUTPUT_DIR", file=sys.stderr)
        sys.exit(2)
    reason = in_use(sys.argv[1])
    if reason:
        print(f"error: {reason}", file=sys.stderr)
    sys.exit(2 if reason else 0)
