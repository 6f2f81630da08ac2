"""Try every key of the run config with values no field should take silently, and report what the
config check did that it must not.

    python tools/dev/fuzz_config.py                      # every key, every value
    python tools/dev/fuzz_config.py --key optimizer      # the keys that start so

The keys come from the schema's dataclasses (Config and the sections it holds; a curriculum phase's
keys on the last phase of configs/tiny/mamba2-implicit.yaml), never from a list. Each key gets NaN,
+inf, -inf, 0, -1, a huge integer, a huge float, a string, a string with a control character, a list,
a mapping, null and true (a list key also lists of such values), each through one of the three ways a
config arrives, in turn: a command-line override, a YAML file that names the tiny config in `base:`,
and an export's config.json (hf.export_reader.checked_run_config). And each key given twice in one
YAML mapping.

A case passes when the check refuses it in one ConfigError naming the key (the key, an element of
it, or a message that names it), or accepts it with every value of the config inside its field's
declared domain (utils.domains), finite and of at most 64 bits, and the key's field declaring a
domain where it is a number. A finding: any other exception (a traceback), a process started, a
value accepted outside its domain or by a numeric field that declares none, a key given twice read
without a word. Exit 1 with the findings.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from implicit_megatron.config import Config, read_config  # noqa: E402
from implicit_megatron.hf.export_reader import CONFIG_KEY, checked_run_config  # noqa: E402
from implicit_megatron.prelaunch import load_config  # noqa: E402
from implicit_megatron.utils import typed_yaml  # noqa: E402
from implicit_megatron.utils.domains import INT64, declares_domain, domain_problems  # noqa: E402
from implicit_megatron.utils.typed_yaml import ConfigError, parse_yaml  # noqa: E402

EXPLICIT = ROOT / "configs" / "tiny" / "mamba2-explicit.yaml"
IMPLICIT = ROOT / "configs" / "tiny" / "mamba2-implicit.yaml"  # the one with phases
VALUES = (".nan", ".inf", "-.inf", "0", "-1", "1" + "0" * 30, "1.0e+308", "x", '"a\\nb"', "[1]", "{a: 1}", "null",
          "true")
LIST_VALUES = ("[.nan]", "[.inf, 1]", "[-1, -1]", "[0, 0]", "[1.0e+308, 1]", "[x]", "[[1]]", "[]")
WAYS = ("override", "file", "config.json")


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of the schema, and how each way of giving a config spells it."""

    dotted: str  # as an override names it: curriculum.phases.free.tol
    canonical: str  # as an error names it: curriculum.phases[1].tol
    path: tuple  # into the config's mapping: ("curriculum", "phases", 1, "tol")
    field: dataclasses.Field
    hint: Any
    base: Path

    @property
    def numeric(self) -> bool:
        return _element(self.hint) in (int, float)

    @property
    def sequence(self) -> bool:
        return typing.get_origin(_bare(self.hint)) in (list, tuple)


class ProcessStarted(BaseException):
    """A process started during a config check (a BaseException: no reader catches it)."""


def _bare(hint: Any) -> Any:
    """`hint` without its `| None`."""
    inner = [a for a in typing.get_args(hint) if a is not type(None)] if type(None) in typing.get_args(hint) else []
    return inner[0] if len(inner) == 1 else hint


def _element(hint: Any) -> Any:
    bare = _bare(hint)
    return typing.get_args(bare)[0] if typing.get_origin(bare) in (list, tuple) else bare


def schema_keys() -> list[Key]:
    """Every key of Config: sections, leaves, and the keys of one curriculum phase."""
    phases = read_config(IMPLICIT).curriculum.phases
    last = len(phases) - 1
    keys: list[Key] = []

    def walk(cls: type, dotted: str, canonical: str, path: tuple, base: Path) -> None:
        hints = typing.get_type_hints(cls)
        for f in (f for f in dataclasses.fields(cls) if f.init):
            hint = hints[f.name]
            key = Key(dotted + f.name, canonical + f.name, (*path, f.name), f, hint, base)
            keys.append(key)
            element = _element(hint)
            if dataclasses.is_dataclass(hint):
                walk(typing.cast(type, hint), f"{key.dotted}.", f"{key.canonical}.", key.path, base)
            elif dataclasses.is_dataclass(element):  # curriculum.phases: the last phase's keys
                walk(typing.cast(type, element), f"{key.dotted}.{phases[last].name}.", f"{key.canonical}[{last}].",
                     (*key.path, last), IMPLICIT)

    walk(Config, "", "", (), EXPLICIT)
    return keys


def cases(keys: list[Key]) -> Iterator[tuple[Key, str]]:
    for key in keys:
        for value in (*VALUES, *(LIST_VALUES if key.sequence else ())):
            yield key, value


def yaml_text(key: Key, value: str, saved: dict[Path, dict], twice: bool = False) -> str:
    """A config file naming the key's base and giving the key `value` (twice: two lines of it). A
    phase's key: the phases before it as they are, then this one with the key's line last."""
    lines = [f"base: {key.base}"]
    depth = 0
    for i, part in enumerate(key.path[:-1]):
        if isinstance(part, int):
            phases = saved[key.base]["curriculum"]["phases"]
            lines += [f"{'  ' * depth}- {json.dumps(p)}" for p in phases[:part]]
            own = [(k, v) for k, v in phases[part].items() if k != key.path[i + 1]]
            lines += [f"{'  ' * depth}- " + f"\n{'  ' * (depth + 1)}".join(f"{k}: {json.dumps(v)}" for k, v in own)]
            depth += 1
            continue
        lines.append(f"{'  ' * depth}{part}:")
        depth += 0 if isinstance(key.path[i + 1], int) else 1
    lines += [f"{'  ' * depth}{key.path[-1]}: {value}"] * (2 if twice else 1)
    return "\n".join(lines) + "\n"


def read(key: Key, value: str, way: str, folder: Path, saved: dict[Path, dict]) -> Config:
    """The config check, given the key's value one way (ConfigError: refused)."""
    if way == "override":
        return load_config(key.base, [f"{key.dotted}={value}"], world_size=1, check_files=False)
    if way == "file":
        path = folder / "case.yaml"
        path.write_text(yaml_text(key, value, saved))
        return load_config(path, [], world_size=1, check_files=False)
    data = copy.deepcopy(saved[key.base])
    node = data
    for part in key.path[:-1]:
        node = node[part]
    node[key.path[-1]] = parse_yaml(value, "config.json")
    return checked_run_config(data, "config.json")


def names(err: ConfigError, key: Key) -> bool:
    """Whether the refusal names the key: the key itself, a key within it, or a message naming it."""
    said = err.key.removeprefix(CONFIG_KEY + ".")
    return said == key.canonical or said.startswith((key.canonical + "[", key.canonical + ".")) or \
        key.canonical in err.message or key.dotted in err.message


def accepted_problem(cfg: Config, key: Key, value: str) -> str | None:
    """Why an accepted config must not have been (None: it may)."""
    for where, held in _leaves(dataclasses.asdict(cfg)):
        if isinstance(held, float) and not math.isfinite(held):
            return f"accepted: {where} holds {held}"
        if isinstance(held, int) and not isinstance(held, bool) and not INT64[0] <= held <= INT64[1]:
            return f"accepted: {where} holds an integer beyond 64 bits"
    outside = next(domain_problems(cfg), None)
    if outside:
        return f"accepted outside its declared domain: {outside[0]}: {outside[1]}"
    if key.numeric and not declares_domain(key.field) and value not in ("null", "[]"):
        return f"accepted by a numeric key that declares no domain ({key.canonical}={value})"
    return None


def _held(data: dict, path: tuple) -> Any:
    """What a saved config holds at `path` (None where it holds nothing: a phase's solver keys)."""
    for part in path:
        if not isinstance(data, (dict, list)) or (isinstance(data, dict) and part not in data):
            return None
        data = data[part]
    return data


def _leaves(value: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{where}[{i}]")
    else:
        yield where, value


def attempt(read_it: Callable[[], Any], check: Callable[[Any], str | None]) -> str | None:
    """Run one case with processes forbidden: None, or what it did that it must not."""

    def forbidden(*args, **kwargs):
        raise ProcessStarted(f"started a process: {args[0] if args else kwargs}")

    popen = subprocess.Popen
    subprocess.Popen = forbidden  # type: ignore[misc, assignment]
    try:
        return check(read_it())
    except ProcessStarted as err:
        return str(err)
    except ConfigError as err:
        return check(err)
    except Exception as err:  # a traceback for the user
        return f"{type(err).__name__}: {err} (not a ConfigError)"
    finally:
        subprocess.Popen = popen  # type: ignore[misc]


@contextlib.contextmanager
def bases_parsed_once() -> Iterator[None]:
    """The tiny config's own files, the same in every case, parsed once: what a case changes is
    parsed anew (a file, an override's value), and each case gets its own copy of the rest."""
    parse, parsed = typed_yaml.parse_yaml, {}
    bases = {path.read_text() for path in (ROOT / "configs").rglob("*.yaml")}

    def cached(text: str, *args, **kwargs):
        if text not in bases:
            return parse(text, *args, **kwargs)
        if text not in parsed:
            parsed[text] = parse(text, *args, **kwargs)
        return copy.deepcopy(parsed[text])

    typed_yaml.parse_yaml = cached
    try:
        yield
    finally:
        typed_yaml.parse_yaml = parse


def fuzz(prefix: str = "", seed: int = 0, say: Callable[[str], None] = print) -> tuple[int, list[str]]:
    """Every case of every key starting with `prefix`: (cases run, findings)."""
    keys = [k for k in schema_keys() if k.dotted.startswith(prefix) or k.canonical.startswith(prefix)]
    saved = {base: read_config(base).to_dict() for base in (EXPLICIT, IMPLICIT)}
    findings: list[str] = []
    count = 0
    with tempfile.TemporaryDirectory(prefix="fuzz-config-") as tmp, bases_parsed_once():
        folder = Path(tmp)
        for key, value in cases(keys):
            way = WAYS[(count + seed) % len(WAYS)]
            count += 1

            def judge(outcome, key=key, value=value):
                if isinstance(outcome, ConfigError):
                    return None if names(outcome, key) else f"refused without naming the key: {outcome}"
                return accepted_problem(outcome, key, value)

            found = attempt(lambda key=key, value=value, way=way: read(key, value, way, folder, saved), judge)
            if found:
                findings.append(f"{key.dotted}={value} ({way}): {found}")
                say(findings[-1])
        for key in keys:  # a key given twice in one mapping
            count += 1
            path = folder / "twice.yaml"
            path.write_text(yaml_text(key, json.dumps(_held(saved[key.base], key.path)), saved, twice=True))

            def twice(outcome, key=key, path=path):
                if isinstance(outcome, ConfigError) and outcome.source == str(path) and \
                        f"the key {key.path[-1]!r} is given twice" in outcome.message:
                    return None
                return f"given twice: {outcome}" if isinstance(outcome, ConfigError) else "given twice, read"

            found = attempt(lambda path=path: load_config(path, [], world_size=1, check_files=False), twice)
            if found:
                findings.append(f"{key.dotted} twice: {found}")
                say(findings[-1])
    return count, findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/dev/fuzz_config.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--key", default="", help="only the keys that start with this")
    parser.add_argument("--seed", type=int, default=0, help="which way each case is given in (they rotate)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    count, findings = fuzz(args.key, args.seed)
    print(f"| keys | cases | findings | s |\n| --- | ---: | ---: | ---: |\n| {args.key or 'all'} | {count} | "
          f"{len(findings)} | {time.perf_counter() - started:.1f} |")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
