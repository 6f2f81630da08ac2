"""What DeepSpeed's launcher hands each node's remote shell besides the arguments, checked first.

Over several nodes (pdsh), DeepSpeed writes `export KEY=VALUE; ... cd DIR; python -m ...` into the
command every node's shell runs: the variables whose names start with MLFLOW, PYTHON, MV2, UCX or
NCCL, each `KEY=VALUE` line of a `.deepspeed_env` file in the home or the working directory, and
the working directory itself. A value with more than `[\\w@%+=:,./-]` goes in double quotes, where
a shell still runs `$(...)` and backquotes and a `"` ends the quoting; the directory goes in bare.
So a value from a received environment file, a job script or a shared profile would run on every
node. `python -m implicit_megatron.train.process.remote_env` (launch/pretrain.sh, before a launch
over several nodes) names the first such value and exits 2; none reaches a node.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

PREFIXES = ("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")  # DeepSpeed's EXPORT_ENVS and the CUDA/ROCm accelerator's
ENV_FILE = os.environ.get("DS_ENV_FILE", ".deepspeed_env")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
BARE = re.compile(r"[\w@%+=:,./-]+")  # what DeepSpeed leaves unquoted
UNSAFE_IN_QUOTES = re.compile(r"[$`\"\\\x00-\x1f\x7f]")  # what a shell still reads inside double quotes


def unsafe_value(value: str) -> str | None:
    """Why `value` must not reach a remote shell in DeepSpeed's double quotes (None: it may)."""
    found = UNSAFE_IN_QUOTES.search(value.strip())
    return None if found is None else f"holds {found.group()!r}, which a shell reads inside double quotes"


def problems(environ: dict[str, str], home: Path, cwd: Path) -> list[str]:
    """Every value a multi-node launch would hand a remote shell that could run there, by name."""
    found = []
    for key, value in sorted(environ.items()):
        if key.startswith(PREFIXES) and unsafe_value(value):
            found.append(f"{key}={value!r} {unsafe_value(value)}")
    for folder in dict.fromkeys((home, cwd)):
        path = folder / ENV_FILE
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            key, sep, value = line.partition("=")
            if not (sep and NAME.fullmatch(key.strip())):
                found.append(f"{path}:{number}: {line!r} is not KEY=VALUE")
            elif unsafe_value(value):
                found.append(f"{path}:{number}: {key.strip()}={value!r} {unsafe_value(value)}")
    if not BARE.fullmatch(str(cwd)):
        found.append(f"the working directory {str(cwd)!r} has characters a shell reads (DeepSpeed's `cd` names "
                     "it unquoted); launch from a path of letters, digits and ./_-")
    return found


def main() -> int:
    found = problems(dict(os.environ), Path.home(), Path.cwd())
    for problem in found:
        print(f"pretrain.sh: {problem}; every node's remote shell would read it (DeepSpeed's pdsh launch)",
              file=sys.stderr)
    return 2 if found else 0


if __name__ == "__main__":
    sys.exit(main())
