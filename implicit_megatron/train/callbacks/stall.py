"""Ending a job in which a rank has stopped giving signs of life, naming that rank and what it was doing.

A rank that is stopped (SIGSTOP, a debugger), hung or cut off leaves the others blocked in a
collective, and a launcher sees no rank exit, so nothing would end the job. A healthy rank, though,
may take any time over a step, a validation or a save. So each rank's watch thread, from the moment
the process group exists, writes a heartbeat (a count and what its rank is doing) into the launch's
rendezvous store every few seconds, and reads the heartbeat of the next rank round the ring: one
write and one read per rank and period, however many ranks there are. When the next rank's
heartbeat has not changed for distributed.timeout_minutes, the watch prints one line naming the silent
rank and what it was doing, and exits 1, which makes the launcher end every rank. The work itself is
never timed. A store that does not answer says nothing of the ranks (a suspended launcher holds it
while the ranks train on, their collectives go peer to peer), and the next rank's silence counts only
up to the store's last answer: while this rank makes progress (its section changes) the watch waits for
the store as long as the backstop (distributed.collective_timeout_minutes); a silent store and a rank
that has made no progress for the limit (the store's host lost, its ranks with it, the others blocked)
end the job naming the store.

Time while this process itself was stopped (SIGSTOP or SIGCONT of the whole job, as a SLURM suspend,
`docker pause` or Ctrl-Z do) is not counted: the watch sees its own sleep overrun and starts counting
afresh. In a world of one process nothing waits for another rank, and there is no watch.

The process groups' own timeouts (engine.collective_timeout, the same backstop) only end collectives
that living ranks never meet; the watch speaks first for any silent rank, and is the one judge of a stall.

A store call waits as long as the store's host is stopped (torch's timeouts do not bound a reply), and a
thread that comes back from one while the interpreter finalizes is ended inside torch's C++ frames: the
process aborts ("terminate called without an active exception", exit 134 after a run that finished).
So `done` ends the talking thread before the rank goes on to its exit: a call the store leaves
unanswered is cut (the read side of the watch's own connection is shut down, and the call fails at
once), and the 'finished' heartbeat is still sent, for the store to hand on once it answers again.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Callable

from implicit_megatron.train.callbacks import Callback

_section = "start-up"
ANSWER_SECONDS = 2.0  # how long `done` waits for the store's answer to a call in flight before cutting it


def section() -> str:
    """What this rank was last doing (e.g. 'step 12', 'start-up: building the engine'), for error lines."""
    return _section


def _exit_naming(line: str) -> None:
    os.write(2, (line + "\n").encode())
    os._exit(1)


class StallWatch(Callback):
    """Watches the next rank round the ring from the moment the process group exists (the start-up
    is watched too); as a callback, it says what this rank does (a step, a validation, a save) and
    that it has finished."""

    priority = 100  # says what the rank does before any other concern acts; ends first

    def __init__(self, minutes: float, rank: int, world: int, store=None,
                 on_stall: Callable[[str], None] = _exit_naming, store_minutes: float = 1440.0) -> None:
        """`store`: the rendezvous store (torch.distributed's default store unless given); `on_stall`
        receives the line (the default prints it and exits 1); `store_minutes`: how long a store may not
        answer (distributed.collective_timeout_minutes)."""
        self.limit, self.minutes, self.rank, self.world = 60.0 * minutes, minutes, rank, world
        self.store_limit, self.store_minutes = 60.0 * max(store_minutes, minutes), store_minutes
        self.period = min(5.0, max(self.limit / 10, 0.05))
        self.on_stall = on_stall
        self.finished = threading.Event()
        self.what = "start-up"
        self.progressed = time.monotonic()  # when this rank last said it does something else
        if world < 2:
            return
        if store is None:
            from torch.distributed import distributed_c10d

            store = distributed_c10d._get_default_store()
        self.address = _address(store)
        before = _sockets()
        self.store = store.clone()  # a connection of its own: the training's store calls never wait on ours
        self.connection = _new_connection(before, _endpoint(store))  # the one `done` may cut
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restarted torchrun keeps its store
        self.mine = f"stall_watch/{attempt}/{rank}"
        self.neighbour = (rank + 1) % world
        self.theirs = f"stall_watch/{attempt}/{self.neighbour}"
        # When the next rank's heartbeat last changed and the store last answered (the talker's clock),
        # what the next rank last said, and the store's last error.
        self.heard = self.reached = time.monotonic()
        self.said: str | None = None
        self.error = ""
        # A store call can block for ever (a stopped store host answers nothing), so one thread talks
        # and another judges.
        self.thread = threading.Thread(target=self._talk, name="stall-watch-heartbeat", daemon=True)
        self.thread.start()
        self.judge = threading.Thread(target=self._judge, name="stall-watch", daemon=True)
        self.judge.start()
        atexit.register(self.done)  # an exit that missed it (the launch ends it itself first)

    def doing(self, what: str) -> None:
        """Say what this rank does from now (e.g. 'step 12'): the next rank names it if this one falls silent."""
        global _section
        self.what = _section = what
        self.progressed = time.monotonic()

    def on_step_start(self, step: int) -> None:
        self.doing(f"step {step + 1}")

    def on_activity(self, what: str) -> None:
        self.doing(what)

    def on_fit_end(self, end) -> None:
        self.done()  # before the tracker's last writes: the neighbour stops watching this rank

    def done(self) -> None:
        """This rank has finished: the previous rank, which watches it, is told so, and the watch's
        threads have ended when this returns, as the process may exit next: a store call still in flight
        after ANSWER_SECONDS (its host stopped or lost) is cut, never left to return into a finalizing
        interpreter (see the module's docstring)."""
        self.what = "finished"
        if self.world < 2 or self.finished.is_set():
            return
        self.finished.set()
        self.thread.join(timeout=ANSWER_SECONDS)
        if self.thread.is_alive() and self.connection is not None:
            os.write(2, f"[train] rank {self.rank}: the rendezvous store at {self.address} has not answered for "
                        f"{time.monotonic() - self.reached:.0f} s at the end of the run: the stall watch closes its "
                        "connection\n".encode())
            with _quiet_stderr():  # torch warns of the failed call with a C++ backtrace, 15 lines a rank
                _cut(self.connection)
                self.thread.join(timeout=ANSWER_SECONDS)
        self.judge.join(timeout=ANSWER_SECONDS)

    def _talk(self) -> None:
        beats, watching = 0, True
        while not self.finished.wait(self.period):
            beats += 1
            try:
                self.store.set(self.mine, f"{beats} {self.what}")
                said = self.store.get(self.theirs).decode() if watching and self.store.check([self.theirs]) else None
            except Exception as err:  # noqa: BLE001 - a timeout or a lost connection: judged, never raised
                self.error = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
                continue
            now = time.monotonic()
            # the store was silent: the next rank's silence while it lasted is not the rank's, so its
            # count starts afresh
            heard = now if now - self.reached > 2 * self.period + 2.0 else self.heard
            if said == "finished":
                watching = False  # the next rank has ended its run: beat on for the previous one
            if not watching or said != self.said:
                self.said, heard = said, now
            self.heard, self.reached = heard, now  # in this order: the judge never sees an answer without its news
        with contextlib.suppress(Exception):  # the job is over: a store already gone is no error
            self.store.set(self.mine, "finished")

    def _judge(self) -> None:
        slack = max(2.0, self.period)  # how late a sleep may end before it counts as a pause of this process
        fresh = tick = time.monotonic()  # silence before `fresh` is not counted
        while not self.finished.wait(self.period):
            now = time.monotonic()
            if now - tick > self.period + slack:
                fresh = now  # this process was stopped (or starved): count afresh
            tick = now
            silent, idle = now - max(self.reached, fresh), now - max(self.progressed, fresh)
            if silent > self.limit and (idle > self.limit or silent > self.store_limit):
                why = f": {self.error}" if self.error else ""
                stuck = f", and this rank has been in {self.what} for {idle:.0f} s" if idle > self.limit else ""
                return self._stall(f"the rendezvous store at {self.address} has not answered for {silent:.0f} s{stuck} "
                                   f"(its host or the network is down{why})",
                                   None if idle > self.limit else
                                   f"distributed.collective_timeout_minutes={self.store_minutes:g}")
            if silent > self.limit:
                continue  # no answer, no news of the next rank, this rank goes on: the store's host is suspended
            now = max(self.reached, fresh)  # the next rank is heard of through the store: its silence counts
            # up to the store's last answer (a store that stops answering stops its count)
            if now - max(self.heard, fresh) > self.limit:
                doing = self.said.split(" ", 1)[1] if self.said else "start-up"
                return self._stall(f"rank {self.neighbour} has given no sign of life for "
                                   f"{now - max(self.heard, fresh):.0f} s (its last heartbeat: {doing}): it has "
                                   "stopped (a signal, a debugger), hung or lost its connection")

    def _stall(self, why: str, limit: str | None = None) -> None:
        if self.finished.is_set():
            return
        limit = limit or f"distributed.timeout_minutes={self.minutes:g}"
        self.on_stall(f"[train] error on rank {self.rank} ({self.what}): {why}; ending the job after "
                      f"{limit} (raise it if a rank may stop for longer)")


def _address(store) -> str:
    """host:port of the TCPStore under the prefix stores torch wraps it in (for the error line)."""
    endpoint = _endpoint(store)
    return f"{endpoint[0]}:{endpoint[1]}" if endpoint else type(store).__name__


def _endpoint(store) -> tuple[str, int] | None:
    """(host, port) of the TCPStore under the prefix stores torch wraps it in; None for another store."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    return (host, port) if host and port else None


def _sockets() -> dict[int, int]:
    """This process's open sockets, file descriptor -> inode (Linux's /proc; none elsewhere)."""
    found = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                info = os.stat(f"/proc/self/fd/{name}")
                if stat.S_ISSOCK(info.st_mode):
                    found[int(name)] = info.st_ino
    return found


def _new_connection(before: dict[int, int], endpoint: tuple[str, int] | None) -> tuple[int, int] | None:
    """(descriptor, inode) of the one socket opened since `before` that is connected to the store's
    port: the clone's connection, which torch does not name. None when it is not exactly one."""
    if endpoint is None:
        return None
    found = []
    for fd, inode in _sockets().items():
        if before.get(fd) == inode:
            continue
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as conn:
            peer = conn.getpeername()
            if isinstance(peer, tuple) and peer[1] == endpoint[1]:
                found.append((fd, inode))
    return found[0] if len(found) == 1 else None


@contextlib.contextmanager
def _quiet_stderr():
    """This process's standard error into nothing while it lasts (the end of a run: nothing else speaks)."""
    saved, nothing = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(nothing, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(nothing)


def _cut(connection: tuple[int, int]) -> None:
    """End the call waiting on this connection for a reply: shutting its read side down makes the call
    fail at once, while what is written on it (the 'finished' heartbeat) still reaches the store."""
    fd, inode = connection
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as conn:
        if os.fstat(conn.fileno()).st_ino == inode:  # still the clone's (a descriptor closed since may be reused)
            conn.shutdown(socket.SHUT_RD)


def name_timeout(err: BaseException, rank: int, minutes: float) -> str | None:
    """One line for a process group's or store's own timeout (gloo's 'Timed out waiting', a store's 'wait
    timeout ... keys: ...') after `minutes` (distributed.collective_timeout_minutes), naming what the
    rank was doing and the key to raise; None for other errors."""
    text = str(err)
    import torch.distributed as dist

    store = isinstance(err, dist.DistStoreError) and "timeout" in text
    collective = isinstance(err, RuntimeError) and any(
        mark in text for mark in ("Timed out waiting", "Application timeout caused pair closure",
                                  "collective operation timeout"))
    if not (store or collective):
        return None
    kind = "the rendezvous store" if store else "a collective"
    return (f"[train] error on rank {rank} ({section()}): {kind} timed out waiting for the other ranks after "
            f"{minutes:g} minutes (distributed.collective_timeout_minutes); unless a line above names a silent "
            f"rank, living ranks kept each other waiting that long: raise distributed.collective_timeout_minutes "
            f"if one may work alone for longer (e.g. a long universal conversion at start-up). {type(err).__name__}: "
            f"{text.splitlines()[0][:300] if text else ''}")
