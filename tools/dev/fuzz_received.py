"""Attack each reader of received files with seeded mutations of a valid file, and report what it
did that a reader must not.

    python tools/dev/fuzz_received.py --seed 1 --cases 2000             # every kind
    python tools/dev/fuzz_received.py --seed 7 --cases 500 --kind shards

A case copies a valid artifact of the kind (shards with their stats, an index cache, a tokenizer
recorded with shards, a YAML config with its `base:`, a hostfile, a launch's environment file, an
export, a checkpoint), changes one of its files (truncated, bits flipped, bytes overwritten, a
count, size or dtype code of a binary header, a number of a text made huge, negative or a string, a
dtype name swapped, deep nesting, a part repeated, the file replaced by a symbolic or hard link to a
file outside, a FIFO, a folder, nothing) and reads it with the kind's reader. It
passes when the reader raises its own error naming the artifact's file, or reads the same as from
the valid artifact (where the kind's files are data to be read as sent, a config or a hostfile,
any reading the reader accepts). A finding: any other exception (a traceback for the user), a
read that takes over --timeout seconds (a hang), a file outside the artifact changed or made, or,
where the kind records what it holds, another reading without a word. Exit 1 with the findings.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass
class Kind:
    """A reader and a valid artifact to attack it with."""

    name: str
    make: Callable[[Path, Path], Path]  # (folder, outside) -> the path the reader takes
    read: Callable[[Path], object]  # the reader; returns what it read, comparable with ==
    errors: tuple[type[BaseException], ...]  # the reader's own errors
    targets: Callable[[Path], list[Path]]  # the files a mutation may change
    changes_are_data: bool = False  # another valid reading is what was sent (a config): not a finding


class Timeout(BaseException):
    """A read over the time limit (raised by the alarm, a BaseException so no reader catches it)."""


NUMBERS = re.compile(rb"-?\d+(\.\d+)?(e[+-]?\d+)?")
ODD_NUMBERS = [b"0", b"-1", b"-64", b"1e308", b"99999999999999999999", b"3.5", b"NaN", b'"x"', b"[]", b"null"]
HEADER_VALUES = [0, 1, -1, 7, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**64 - 1, -(2**63)]
WORDS = [b"F32", b"I32", b"F64", b"BOOL", b"BF16", b"U8", b"true", b"false", b"null", b"~", b"{}", b"[]"]


def mutate(path: Path, rng: random.Random, outside: Path) -> str:
    """Change `path` one seeded way; returns what was done."""
    data = path.read_bytes() if path.is_file() else b""
    how = rng.choice(["truncate", "flip", "overwrite", "number", "word", "nest", "grow", "header",
                      "symlink", "hardlink", "fifo", "folder", "empty", "missing"])
    if how == "truncate" and data:
        cut = rng.randrange(len(data))
        path.write_bytes(data[:cut])
        return f"truncated {path.name} to {cut} of {len(data)} bytes"
    if how == "flip" and data:
        changed = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            changed[rng.randrange(len(changed))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(changed))
        return f"flipped bits of {path.name}"
    if how == "overwrite" and data:
        at, size = rng.randrange(len(data)), rng.randint(1, 32)
        path.write_bytes(data[:at] + rng.randbytes(size) + data[at + size:])
        return f"overwrote {size} bytes of {path.name} at {at}"
    if how == "number" and NUMBERS.search(data[:65536]):
        found = list(NUMBERS.finditer(data[:65536]))
        hit = rng.choice(found)
        path.write_bytes(data[:hit.start()] + rng.choice(ODD_NUMBERS) + data[hit.end():])
        return f"replaced the number {hit.group().decode()} of {path.name}"
    if how == "word":
        present = [w for w in WORDS if w in data[:65536]]
        if present:
            old = rng.choice(present)
            path.write_bytes(data.replace(old, rng.choice(WORDS), 1))
            return f"replaced {old.decode()} in {path.name}"
    if how == "header" and len(data) >= 8:  # a count, a size or a dtype code of a binary header
        at = rng.randrange(min(len(data), 64) - 7)
        if rng.random() < 0.5:
            value = rng.choice(HEADER_VALUES)
            field = struct.pack("<q" if value < 0 else "<Q", value)
        else:
            field = bytes([rng.randrange(256)]) + data[at + 1:at + 8]
        path.write_bytes(data[:at] + field + data[at + 8:])
        return f"wrote a header field of {path.name} at {at}"
    if how == "nest":
        depth = rng.choice([200, 5000, 100000])
        path.write_bytes(b"[" * depth + b"]" * depth if rng.random() < 0.5 else b"a:\n" + b"- " * depth + b"1\n")
        return f"made {path.name} {depth} levels deep"
    if how == "grow" and data:
        at = rng.randrange(len(data))
        path.write_bytes(data[:at] + data[at:at + 4096] * rng.randint(2, 50) + data[at:])
        return f"repeated a part of {path.name}"
    if how in ("symlink", "hardlink"):
        target = outside / f"{how}-{path.name}"
        target.write_bytes(data)
        _remove(path)
        (path.symlink_to(target) if how == "symlink" else os.link(target, path))
        return f"{path.name} made a {how} to a file outside"
    if how == "fifo":
        _remove(path)
        os.mkfifo(path)
        return f"{path.name} made a FIFO"
    if how == "folder":
        _remove(path)
        path.mkdir()
        return f"{path.name} made a folder"
    if how == "missing":
        _remove(path)
        return f"{path.name} removed"
    path.write_bytes(b"")
    return f"{path.name} emptied"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` and a digest of its content (a write outside changes it)."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "?"
    return found


def run_case(kind: Kind, pristine: Path, expected: object, work: Path, outside: Path, rng: random.Random,
             timeout: float) -> tuple[str, str | None]:
    """(what was done, a finding or None) for one seeded mutation of a copy of `pristine`."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work, symlinks=True)
    artifact = work / pristine_entry(pristine)
    targets = kind.targets(artifact)
    did = mutate(rng.choice(targets), rng, outside)
    before = snapshot(outside)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        got = kind.read(artifact)
    except Timeout:
        return did, f"hang: no answer within {timeout} s"
    except kind.errors as err:
        got = None
        if str(work) not in str(err) and str(outside) not in str(err):  # a link's target may be what is named
            return did, f"{type(err).__name__} naming no file of the artifact: {str(err)[:300]}"
    except BaseException as err:  # noqa: BLE001 - any other exception is what the fuzzer looks for
        if isinstance(err, KeyboardInterrupt):
            raise
        return did, f"{type(err).__name__} (not the reader's error): {str(err)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if snapshot(outside) != before:
        return did, "a file outside the artifact was changed or made"
    if got is not None and got != expected and not kind.changes_are_data:
        return did, "read another result without a word"
    return did, None


def pristine_entry(pristine: Path) -> str:
    return (pristine / ".entry").read_text()


def _alarm(signum, frame):
    raise Timeout


def fuzz(kind: Kind, seed: int, cases: int, timeout: float, say=print) -> list[str]:
    """Run `cases` cases of one kind; returns the findings, one line each."""
    findings = []
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{kind.name}-") as root:
        root_path = Path(root)
        pristine, outside = root_path / "pristine", root_path / "outside"
        pristine.mkdir()
        outside.mkdir()
        entry = kind.make(pristine, outside)
        (pristine / ".entry").write_text(str(entry.relative_to(pristine)))
        expected = kind.read(entry)
        rng = random.Random(f"{kind.name}:{seed}")
        for case in range(cases):
            did, finding = run_case(kind, pristine, expected, root_path / "case", outside, rng, timeout)
            if finding:
                findings.append(f"{kind.name} seed {seed} case {case}: {did}: {finding}")
                say(findings[-1])
    return findings


def main(argv: list[str] | None = None) -> int:
    from fuzz_kinds import KINDS

    parser = argparse.ArgumentParser(prog="python tools/dev/fuzz_received.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=200, help="cases per kind")
    parser.add_argument("--kind", choices=sorted(KINDS), action="append", help="only these kinds (repeatable)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds one read may take")
    args = parser.parse_args(argv)
    rows, found = [], 0
    for name in args.kind or sorted(KINDS):
        started = time.perf_counter()
        findings = fuzz(KINDS[name], args.seed, args.cases, args.timeout)
        rows.append((name, args.cases, len(findings), time.perf_counter() - started))
        found += len(findings)
    print("| kind | cases | findings | s |\n| --- | ---: | ---: | ---: |")
    for name, cases, count, seconds in rows:
        print(f"| {name} | {cases} | {count} | {seconds:.1f} |")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
