"""LAUNCHER_ARGS, read as the options of the launcher it goes to, each value checked.

    read(LAUNCHER_ARGS, launcher)  # its words; LaunchError naming the first that is not let through

DeepSpeed's launcher puts some of its options into the command every node's remote shell runs
(`--venv_script` as `source VALUE;`, `--enable_each_rank_log`, `--launcher_args` before pdsh's
command), bare: an option is let through only where it is one the launcher knows and the launch does
not set itself, and its value is a word no shell reads as more than a word. torchrun runs on this
node without a shell; its options are held to the same rule so that a mistake is one line here, not
a traceback later. Options the launch sets (the port, the node and process counts, the hostfile, the
module) are refused: the variables that set them are named instead.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable

from implicit_megatron.launch.environment import PROG, LaunchError

WORD = re.compile(r"[A-Za-z0-9_./,:@+-]+")  # no character a shell (or pdsh's %n) reads as more
HOSTS = re.compile(r"[A-Za-z0-9_.:@,-]+")  # DeepSpeed's `host1:0,1@host2`


def _word(value: str) -> str | None:
    return None if WORD.fullmatch(value) and not value.startswith("-") else "is not a plain word (letters, " \
        "digits and ./_,:@+-)"


def _choice(*choices: str) -> Callable[[str], str | None]:
    return lambda value: None if value in choices else f"is not one of {', '.join(choices)}"


def _count(least: int, most: int) -> Callable[[str], str | None]:
    return lambda value: None if value.isdigit() and least <= int(value) <= most else \
        f"is not a whole number from {least} to {most}"


def _seconds(value: str) -> str | None:
    try:
        ok = math.isfinite(float(value)) and float(value) > 0
    except ValueError:
        ok = False
    return None if ok else "is not a finite number of seconds above 0"


def _hosts(value: str) -> str | None:
    return None if HOSTS.fullmatch(value) else "is not a host list (host1:0,1@host2)"


def _cores(value: str) -> str | None:
    return None if re.fullmatch(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*", value) else "is not a core list (0-3,8)"


def _streams(value: str) -> str | None:
    return None if re.fullmatch(r"[0-3]|[0-9]+:[0-3](,[0-9]+:[0-3])*", value) else "is not 0-3 or RANK:0-3,..."


FLAG = None  # an option without a value
# DeepSpeed's launcher (deepspeed/launcher/runner.py), less what the launch sets.
DEEPSPEED: dict[str, Callable[[str], str | None] | None] = {
    "--launcher": _choice("pdsh", "openmpi", "mvapich", "slurm", "impi", "mpich"),
    "--launcher_args": None,  # checked word by word, for the launcher chosen: _launcher_words
    "-i": _hosts, "--include": _hosts, "-e": _hosts, "--exclude": _hosts,
    "--ssh_port": _count(1, 65535), "--venv_script": _word, "--enable_each_rank_log": _word,
    "--bind_cores_to_rank": FLAG, "--bind_core_list": _cores, "--no_ssh_check": FLAG, "--force_multi": FLAG,
    "--save_pid": FLAG, "--log_level": _choice("debug", "info", "warning", "error", "critical"), "-q": FLAG,
}
# torchrun (torch.distributed.run) on one node, less what the launch sets (it takes _ for - too).
TORCHRUN: dict[str, Callable[[str], str | None] | None] = {
    "--max-restarts": _count(0, 1000), "--monitor-interval": _seconds,
    "--start-method": _choice("spawn", "fork", "forkserver"), "--redirects": _streams, "-r": _streams,
    "--tee": _streams, "-t": _streams, "--log-dir": _word, "--role": _word,
}
SET_BY_THE_LAUNCH = {"--master_port": "MASTER_PORT", "--master-port": "MASTER_PORT", "--master_addr": "MASTER_ADDR",
                     "--master-addr": "MASTER_ADDR", "--num_nodes": "NUM_NODES", "--nnodes": "NUM_NODES",
                     "--num_gpus": "GPUS_PER_NODE", "--num_accelerators": "GPUS_PER_NODE",
                     "--nproc_per_node": "NPROC", "--nproc-per-node": "NPROC", "-H": "HOSTFILE",
                     "--hostfile": "HOSTFILE"}


def _refuse(word: str, why: str) -> LaunchError:
    return LaunchError(f"{PROG}: LAUNCHER_ARGS: {shlex.quote(word)} {why}")


def _pairs(words: list[str], launcher: str) -> list[tuple[str, str | None]]:
    """(option, value or None) for each option in `words`; torchrun's names in its - spelling."""
    options = DEEPSPEED if launcher == "deepspeed" else TORCHRUN
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        name, sep, value = words[i].partition("=")
        if launcher != "deepspeed" and name.startswith("--"):
            name = name.replace("_", "-")
        if name in SET_BY_THE_LAUNCH or name.replace("-", "_") in SET_BY_THE_LAUNCH:
            set_by = SET_BY_THE_LAUNCH.get(name) or SET_BY_THE_LAUNCH[name.replace("-", "_")]
            raise _refuse(words[i], f"is set by the launch: set {set_by} instead")
        if name not in options:
            raise _refuse(words[i], f"is not an option of the {launcher} launcher that the launch lets through "
                          f"({', '.join(sorted(options))})")
        check = options[name]
        if check is FLAG and name != "--launcher_args":
            if sep:
                raise _refuse(words[i], "takes no value")
            pairs.append((name, None))
            i += 1
            continue
        if not sep and i + 1 >= len(words):
            raise _refuse(name, "needs a value")
        if not sep:
            i += 1
            value = words[i]
        if check is not None and check(value):
            raise _refuse(f"{name} {value}", str(check(value)))
        pairs.append((name, value))
        i += 1
    return pairs


def _launcher_words(value: str, launcher: str) -> None:
    """`--launcher_args VALUE`: words for pdsh or mpirun. Under pdsh (the default) a word that is no
    option becomes the nodes' command, so none is let through; elsewhere plain words only."""
    if launcher == "pdsh":
        raise _refuse("--launcher_args", "is not let through to pdsh: a word there would run on every node")
    for word in value.split():
        if not WORD.fullmatch(word):
            raise _refuse(f"--launcher_args {value}", f"holds {shlex.quote(word)}, not a plain word")


def read(value: str, launcher: str) -> list[str]:
    """LAUNCHER_ARGS as words (split as a shell would, quotes included) if each is a known option of
    `launcher` (deepspeed, torchrun) with a value it accepts; else LaunchError naming the first that is not."""
    try:
        words = shlex.split(value)
    except ValueError as err:
        raise _refuse(value, f"cannot be split into words ({err})") from None
    pairs = _pairs(words, launcher)
    chosen = dict(pairs).get("--launcher") or "pdsh"
    for name, given in pairs:
        if name == "--launcher_args":
            _launcher_words(given or "", chosen)
    return words
