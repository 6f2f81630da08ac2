"""Everything a launch over several nodes hands another node's shell, checked by one function.

    check(environ)                   # before anything starts: LaunchError naming each value (and TMPDIR)
    write_environment_file(environ)  # the environment file of this launch; its path

Over several nodes (pdsh), DeepSpeed writes `export KEY=VALUE; ... cd DIR; python -m ...` into the
command every node's shell runs: the variables whose names start with MLFLOW, PYTHON, MV2, UCX or
NCCL, each `KEY=VALUE` line of its environment file (DS_ENV_FILE, default `.deepspeed_env` in the
home and the working directory), and the working directory itself. A name goes in bare: one that is
not `[A-Za-z_][A-Za-z0-9_]*` is refused by name. A value with more than
`[\\w@%+=:,./-]` goes in double quotes, where a shell still runs `$(...)` and backquotes and a `"`
ends the quoting; the directory goes in bare. The launch (supervisor.py) passes its ranks what a rank on one
node gets (FORWARDED: the thread count, the launch itself: run_control.LAUNCH) through an
environment file of this launch's own, the user's lines first: every one of those values, whatever
its name, goes through `unsafe_value` too, so nothing from a received environment file, a job script
or a shared profile runs on a node.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from implicit_megatron.launch.environment import PROG, LaunchError
from implicit_megatron.run_control import LAUNCH
from implicit_megatron.utils.received_file import UnreadableFile, read_small_file

PREFIXES = ("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")  # DeepSpeed's EXPORT_ENVS and the CUDA/ROCm accelerator's
# what the launch hands its ranks on every node through the environment file
FORWARDED = (LAUNCH, "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM", "DS_ACCELERATOR")
MAX_ENV_FILE_BYTES = 1 << 20  # KEY=VALUE lines for a node's shell
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BARE = re.compile(r"[\w@%+=:,./-]+")  # what DeepSpeed leaves unquoted
UNSAFE_IN_QUOTES = re.compile(r"[$`\"\\\x00-\x1f\x7f]")  # what a shell still reads inside double quotes


def unsafe_value(value: str) -> str | None:
    """Why `value` must not reach a remote shell in DeepSpeed's double quotes (None: it may)."""
    found = UNSAFE_IN_QUOTES.search(value.strip())
    return None if found is None else f"holds {found.group()!r}, which a shell reads inside double quotes"


def env_files(environ: dict[str, str], home: Path, cwd: Path) -> list[Path]:
    """The environment files DeepSpeed reads: DS_ENV_FILE (default .deepspeed_env) in the home and the
    working directory, or once where it is an absolute path."""
    name = environ.get("DS_ENV_FILE", ".deepspeed_env")
    folders = [home] if os.path.isabs(name) else list(dict.fromkeys((home, cwd)))
    return [path for path in (folder / name for folder in folders) if path.is_file()]


def _user_lines(environ: dict[str, str], home: Path, cwd: Path) -> tuple[list[str], list[str]]:
    """(KEY=VALUE lines of the user's environment files, what is wrong in them)."""
    lines, found = [], []
    for path in env_files(environ, home, cwd):
        try:
            text = read_small_file(path, MAX_ENV_FILE_BYTES, "an environment file (KEY=VALUE lines)")
        except UnreadableFile as err:
            found.append(str(err))
            continue
        for number, line in enumerate(text.decode("utf-8", errors="replace").splitlines(), 1):
            key, sep, value = line.partition("=")
            if not line.strip():
                continue
            if not (sep and NAME.fullmatch(key.strip())):
                found.append(f"{path}:{number}: {line!r} is not KEY=VALUE")
            elif unsafe_value(value):
                found.append(f"{path}:{number}: {key.strip()}={value!r} {unsafe_value(value)}")
            else:
                lines.append(line)
    return lines, found


def problems(environ: dict[str, str], home: Path, cwd: Path) -> list[str]:
    """Every name and value a multi-node launch would hand a remote shell that could run there, by name.
    A name that is not one is refused rather than left out: the ranks would run without a setting
    the user gave, and no shell can have set it (only `env` can)."""
    exported = sorted(key for key in environ if key.startswith(PREFIXES) or key in FORWARDED)
    found = [f"the variable name {key!r} is not a name ({NAME.pattern}): DeepSpeed writes it bare in its "
             "`export NAME=VALUE;`" for key in exported if not NAME.fullmatch(key)]
    found += [f"{key}={environ[key]!r} {unsafe_value(environ[key])}" for key in exported
              if NAME.fullmatch(key) and unsafe_value(environ[key])]
    found += _user_lines(environ, home, cwd)[1]
    if not BARE.fullmatch(str(cwd)):
        found.append(f"the working directory {str(cwd)!r} has characters a shell reads (DeepSpeed's `cd` names "
                     "it unquoted); launch from a path of letters, digits and ./_-")
    return found


def tmpdir_problem(environ: dict[str, str]) -> str | None:
    """Why TMPDIR, where this launch writes its environment file, cannot hold it (None: it can)."""
    folder = environ.get("TMPDIR")
    if not folder or (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)):
        return None
    why = "it is not a folder" if os.path.exists(folder) else "it does not exist"
    return f"TMPDIR={folder} is not a folder this launch can write its environment file in ({why})"


def environment_file(environ: dict[str, str], home: Path, cwd: Path) -> str:
    """The text of this launch's environment file: the user's lines, then FORWARDED as set here."""
    lines = _user_lines(environ, home, cwd)[0]
    lines += [f"{key}={environ[key]}" for key in FORWARDED if environ.get(key)]
    return "".join(f"{line}\n" for line in lines)


def check(environ: dict[str, str]) -> None:
    """Before anything starts: raise LaunchError naming each value a node's shell would run."""
    found = problems(environ, Path.home(), Path.cwd())
    if tmpdir_problem(environ):
        raise LaunchError(f"{PROG}: {tmpdir_problem(environ)}")
    if found:
        raise LaunchError("\n".join(f"{PROG}: {problem}; every node's remote shell would read it (DeepSpeed's pdsh "
                                     "launch)" for problem in found))


def write_environment_file(environ: dict[str, str]) -> str:
    """This launch's environment file (removed by the launch at its end); its path."""
    text = environment_file(environ, Path.home(), Path.cwd())
    try:
        handle, name = tempfile.mkstemp(prefix="pretrain-env.", dir=environ.get("TMPDIR") or None)
        with os.fdopen(handle, "w") as out:
            out.write(text)
    except OSError as err:  # checked before the launch (problems); a full disk or a folder gone since
        raise LaunchError(f"{PROG}: TMPDIR={environ.get('TMPDIR') or tempfile.gettempdir()}: the launch's environment "
                          f"file could not be written ({type(err).__name__}: {err.strerror})") from None
    return name
