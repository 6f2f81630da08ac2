"""A DeepSpeed hostfile, read by our own code before DeepSpeed's launcher reads it.

    read_hostfile(FILE)  -> [Host(name, slots), ...]

One host per line, `HOST slots=N` (N processes on it: GPUs, or CPU processes), `#` comments and blank
lines ignored: DeepSpeed's format. What DeepSpeed would end in a traceback (a host listed twice, a
slot count that is no number) or take without a word (`slots=0`, a field it ignores, a host name a
remote shell would read as more than a name) is one line naming the file, the line and what was
expected, and exit 2, before any process starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from implicit_megatron.utils.received_file import UnreadableFile, read_small_text

HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")  # a name or an address: pdsh and ssh pass it to a shell
MAX_BYTES = 1 << 20


class HostfileError(ValueError):
    """A hostfile that cannot be launched on; the message names the file and the line."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def read_hostfile(path: str | Path) -> list[Host]:
    """The hosts of `path` in order, each with its slots."""
    path = Path(path)
    try:
        text = read_small_text(path, MAX_BYTES, "a hostfile (a line per node, 'HOST slots=N')")
    except UnreadableFile as err:
        raise HostfileError(f"{err} (cannot be read as a hostfile)") from None
    hosts: dict[str, Host] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{path}:{number}"
        name, rest = fields[0], fields[1:]
        if not HOST.fullmatch(name):
            raise HostfileError(f"{where}: host {name!r} is not a host name or address (letters, digits, . _ : -)")
        if len(rest) != 1 or not rest[0].startswith("slots="):
            raise HostfileError(f"{where}: {line.strip()!r}: expected 'HOST slots=N' (N processes on the host)")
        count = rest[0].removeprefix("slots=")
        if not count.isdigit() or int(count) < 1:
            raise HostfileError(f"{where}: slots={count}: expected a whole number of at least 1")
        if name in hosts:
            raise HostfileError(f"{where}: host {name!r} is listed twice (once per node, with all its slots)")
        hosts[name] = Host(name, int(count))
    if not hosts:
        raise HostfileError(f"{path}: no host; expected a line 'HOST slots=N' per node")
    return list(hosts.values())
