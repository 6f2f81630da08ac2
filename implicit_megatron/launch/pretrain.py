"""The launch of one run:  python -m implicit_megatron.launch [CONFIG] [key=value ...]

launch/pretrain.sh sets up the environment where needed and hands over to this (its header says what
the variables do). In order, before any process starts: the settings read and checked
(environment.py), every value for another node's shell checked (node_shell.py), the world counted
(world.py, the hostfile read by our own code), the config checked for that world, the output folder
taken by no other run. Then the launcher (command.py) runs under supervisor.py, which turns the stop
signals (implicit_megatron/run_control.py) into the graceful stop. A process that is a rank already
(RANK and LOCAL_RANK set by a launcher, or one `srun` task of several) becomes that rank instead.

Exit status: 0 for a finished run or a graceful stop, 2 for a refusal (one line naming what is
wrong), 130 after a second Ctrl-C, otherwise the launcher's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from implicit_megatron.launch import node_shell
from implicit_megatron.launch.command import RANK_MODULE, launcher_command
from implicit_megatron.launch.environment import (
    PROG,
    LaunchEnvironment,
    LaunchError,
    launched_rank,
    slurm_task_rank,
)
from implicit_megatron.launch.supervisor import LaunchResult, supervise
from implicit_megatron.launch.world import world_of
from implicit_megatron.prelaunch import checked_configs
from implicit_megatron.run_control import STOP_ASKED, StopSignals, ignore_stop_signals, install_stop_signals
from implicit_megatron.train.process.run_lock import in_use
from implicit_megatron.utils.typed_yaml import ConfigError

DEFAULT_CONFIG = "configs/quickstart.yaml"
DEFAULTS = {"MLFLOW_DISABLE_TELEMETRY": "true", "TOKENIZERS_PARALLELISM": "false"}


def without_local_rank(argv: list[str]) -> list[str]:
    """A launcher may add --local_rank=N; LOCAL_RANK in the environment says the same."""
    return [a for a in argv if not a.startswith(("--local_rank=", "--local-rank="))]


def be_the_rank(environ: dict[str, str], python: str, args: list[str], signals: StopSignals) -> None:
    """exec the rank. A stop asked already is the rank's to honour; one between here and the rank's
    own handler is ignored rather than fatal (a rank killed by it fails the whole job)."""
    if signals.asked():
        environ[STOP_ASKED] = signals.asked() or "SIGTERM"
    ignore_stop_signals()
    os.execvpe(python, [python, "-m", RANK_MODULE, *args], environ)


def checked_config(args: list[str], world_size: int) -> tuple[str, str | None]:
    """The config checked for this world, as every rank will load it: (its output folder, its
    tracking store). Its output folder and store are this launch's, never what a config saved in
    the folder says; a curriculum is checked phase by phase."""
    try:
        first = checked_configs(args[0], args[1:], world_size)[0]
    except ConfigError as err:
        raise LaunchError(f"config error: {err}") from None
    return str(first.output_dir), first.tracking.uri


def launch(argv: list[str], environ: dict[str, str], signals: StopSignals) -> LaunchResult:
    """One launch of CONFIG [overrides] with `environ` (LaunchError: refused)."""
    args = without_local_rank(argv) or [DEFAULT_CONFIG]
    environ = {**DEFAULTS, **environ}
    env = LaunchEnvironment.read(environ)
    environ.update(slurm_task_rank(environ))
    if launched_rank(environ):  # started by a launcher (or srun): be this rank
        be_the_rank(environ, env.python, args, signals)
    if env.multi_node:
        node_shell.check(environ)
    world = world_of(env)
    command = launcher_command(env, world, world.port(env), args)  # LAUNCHER_ARGS checked: before the config
    output_dir, tracking_uri = checked_config(args, world.size)
    held = in_use(output_dir)  # one run per output folder: refused before this launch writes into it
    if held:
        raise LaunchError(f"error: {held}")
    environ["OMP_NUM_THREADS"] = world.threads(environ)
    if env.multi_node:
        # pdsh's ssh: a node that vanishes ends its connection within 10 s of silence instead of never
        ssh = environ.get("PDSH_SSH_ARGS_APPEND", "")
        environ["PDSH_SSH_ARGS_APPEND"] = f"{ssh} -o ServerAliveInterval=5 -o ServerAliveCountMax=2".strip()
        if not world.gpus:
            environ.setdefault("DS_ACCELERATOR", "cpu")  # CPU ranks on gloo, on every node
    return supervise(command, Path(output_dir), environ, signals, env.multi_node, tracking_uri)


def main(argv: list[str] | None = None, signals: StopSignals | None = None) -> int:
    """`signals`: taken already (__main__.py takes them before importing this)."""
    signals = signals or install_stop_signals(interrupt=False)  # Ctrl-C: once the ranks run (before: at once)
    try:
        return launch(sys.argv[1:] if argv is None else argv, dict(os.environ), signals).status
    except LaunchError as err:
        print(err, file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the ranks start (after, Ctrl-C asks for the graceful stop)
        print(f"{PROG}: stopped by Ctrl-C before the ranks started: nothing was trained", file=sys.stderr)
        return 130
