"""YAML files -> typed dataclasses, with `base:` inheritance and dotted overrides.

Every value remembers where it came from (a file or the command line), so that an
error names the file, the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from implicit_megatron.utils.domains import field_problems, huge_integer

BASE_KEY = "base"
_YAML12_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
COMMAND_LINE = "command line"


class ConfigError(ValueError):
    """A configuration problem, reported as `source: key: message`."""

    def __init__(self, source: str, key: str, message: str):
        self.source, self.key, self.message = source, key, message
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {message}" if key else f"{where}{message}")


# --------------------------------------------------------------------------- reading

MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB: a larger file is refused before it is read whole
MAX_BASE_DEPTH = 32  # files in one `base:` chain
MAX_BASE_READS = 32  # files read for one config in all, a file named twice counted twice (a fan-out of bases)


class _NoAliases(yaml.SafeLoader):
    """YAML without aliases (`*name`): a few hundred bytes of nested aliases expand to gigabytes
    when the config is walked. No config needs them; anchors alone are harmless. And without a key
    twice in one mapping, which YAML forbids and PyYAML reads as the last one, silently."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in a config",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the constructor names it
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice in one mapping (first on line {first.line + 1})",
                        key_node.start_mark)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, source: str, key: str = "", what: str = "not valid YAML") -> Any:
    """`text` as YAML, or a ConfigError naming `source` and `key` (also for an integer of more digits
    than Python converts, or nesting deeper than the parser's recursion)."""
    try:
        return yaml.load(text, Loader=_NoAliases)  # noqa: S506  # a SafeLoader without aliases
    except yaml.MarkedYAMLError as err:  # one line: where in the text, and what
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(source, key, f"{what}: {where}{'; '.join(p for p in (err.context, err.problem) if p)}") \
            from None
    except (yaml.YAMLError, ValueError) as err:  # ValueError: an integer of over 4,300 digits
        raise ConfigError(source, key, f"{what}: {err}") from None
    except RecursionError:
        raise ConfigError(source, key, f"{what}: nested too deeply") from None


def read_yaml_chain(path: str | os.PathLike, _seen: tuple[Path, ...] = (),
                    _reads: list[Path] | None = None) -> tuple[dict, dict[str, str]]:
    """Read a YAML file and the chain of files it extends through `base:`.

    Returns the merged mapping and, for every leaf key (dotted), the file that set it. At most
    MAX_BASE_DEPTH files in one chain and MAX_BASE_READS reads in all (`_reads`: those so far).
    """
    path = Path(path).resolve()
    reads = [] if _reads is None else _reads
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(str(path), BASE_KEY, f"circular base chain: {chain}")
    if len(_seen) >= MAX_BASE_DEPTH:
        raise ConfigError(str(_seen[-1]), BASE_KEY, f"a base chain of more than {MAX_BASE_DEPTH} files")
    if len(reads) >= MAX_BASE_READS:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(str(_seen[-1]), BASE_KEY, f"more than {MAX_BASE_READS} files to read in all (a base named "
                                                    f"more than once is read each time), at {chain}")
    reads.append(path)
    data = parse_yaml(config_text(path), str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", f"expected a mapping at the top level, got {type(data).__name__}")

    merged: dict = {}
    sources: dict[str, str] = {}
    bases = data.pop(BASE_KEY, None)
    for base in [bases] if isinstance(bases, str) else (bases or []):
        base_data, base_sources = read_yaml_chain(path.parent / base, (*_seen, path), reads)
        merged, sources = merge(merged, sources, base_data, base_sources)
    own_sources = {key: str(path) for key in leaf_keys(data)}
    return merge(merged, sources, data, own_sources)


def config_text(path: Path, kind: str = "YAML") -> str:
    """The text of a config file: a regular file (not a device, a FIFO or a folder) of at most
    MAX_CONFIG_BYTES, read in UTF-8; anything else one ConfigError naming the file. `kind`: YAML, or
    JSON for a model folder's config.json (utils.json_config)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(str(path), "", f"is not a regular file (a config is a {kind} file)")
        with path.open("rb") as f:  # a size the file system reports may be 0 (/proc): read at most the limit
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(str(path), "", "config file not found") from None
    except OSError as err:
        raise ConfigError(str(path), "", f"cannot be read ({err.strerror or type(err).__name__})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(str(path), "", f"over {MAX_CONFIG_BYTES} bytes: a config is at most {MAX_CONFIG_BYTES}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        why = f"not UTF-8 text (byte {err.start}): not a {kind} config, or damaged"
        raise ConfigError(str(path), "", why) from None


def leaf_keys(mapping: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            keys.extend(leaf_keys(value, dotted + "."))
        else:
            keys.append(dotted)
    return keys


def merge(base: dict, base_sources: dict, top: dict, top_sources: dict) -> tuple[dict, dict]:
    """Deep-merge `top` over `base`: mappings merge, everything else (lists too) replaces."""
    sources = {k: v for k, v in base_sources.items() if not _replaced_by(k, top)}
    sources.update(top_sources)
    return _merge_data(base, top), sources


def _merge_data(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        both_maps = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge_data(out[key], value) if both_maps else value
    return out


def _replaced_by(dotted: str, top: dict) -> bool:
    """True when `top` sets `dotted` or one of its parents to something that is not a mapping."""
    node: Any = top
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
        if not isinstance(node, dict) or not node:
            return True
    return True


def dashed_override(args: list[str]) -> str | None:
    """The first argument written as an option but meant as an override (`--train.steps=20`): the
    command lines take overrides as key=value, and argparse would answer such a word with its usage."""
    for arg in args:
        key = arg.split("=", 1)[0]
        if arg.startswith("-") and "=" in arg and "." in key:
            return f"{arg}: an override is key=value without leading dashes: {arg.lstrip('-')}"
    return None


def apply_overrides(data: dict, sources: dict, overrides: list[str]) -> tuple[dict, dict]:
    """Apply `a.b.c=value` overrides; values are parsed as YAML (null, 4, [1, 2], true).

    An element of a list is named by its index or, in a list of mappings with a `name`, by that
    name: `curriculum.phases.free.tol=0.01`, `curriculum.phases.1.launch.num_nodes=2` and
    `curriculum.phases[1].tol=0.01` change one phase and keep the others."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(COMMAND_LINE, item, "expected an override of the form key.sub_key=value")
        dotted, raw = item.split("=", 1)
        dotted = dotted.strip().lstrip("-")
        value = parse_yaml(raw, COMMAND_LINE, dotted, "value is not valid YAML") if raw.strip() else ""
        parts = [p for part in re.sub(r"\[(\d+)\]", r".\1", dotted).split(".") for p in [part] if p]
        if not parts:
            raise ConfigError(COMMAND_LINE, item, "expected an override of the form key.sub_key=value: "
                                                  "the key is empty")
        if _crosses_a_list(data, parts):
            data, key = _set_in_list(data, parts, value, dotted)
            sources = {k: v for k, v in sources.items() if k != key and not k.startswith(key + ".")}
            sources.update({key: COMMAND_LINE} if not isinstance(value, dict) or not value else
                           {f"{key}.{k}": COMMAND_LINE for k in leaf_keys(value)})
            continue
        nested: Any = value
        for part in reversed(parts):
            nested = {part: nested}
        data, sources = merge(data, sources, nested, {k: COMMAND_LINE for k in leaf_keys(nested)})
    return data, sources


def _crosses_a_list(data: Any, parts: list[str]) -> bool:
    """Whether the path goes into an element of an existing list (not just replaces the list)."""
    node = data
    for i, part in enumerate(parts):
        if isinstance(node, list):
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
        if isinstance(node, list) and i == len(parts) - 1:
            return False  # the whole list is replaced
    return False


def _set_in_list(data: Any, parts: list[str], value: Any, dotted: str) -> tuple[Any, str]:
    """A copy of `data` with the value set at the path; returns it and the canonical key of what
    was set (list elements as `[i]`, e.g. curriculum.phases[1].tol), which errors then name."""
    if not parts:
        return value, ""
    head, rest = parts[0], parts[1:]
    if isinstance(data, list):
        names = [e.get("name") for e in data if isinstance(e, dict)]
        if head.isdigit() and int(head) < len(data):
            index = int(head)
        elif head in names:
            index = names.index(head)
        else:
            known = f"names {', '.join(map(str, names))} or " if any(names) else ""
            raise ConfigError(COMMAND_LINE, dotted, f"no element {head!r} in this list (expected {known}an index "
                                                    f"below {len(data)})")
        child, key = _set_in_list(data[index], rest, value, dotted)
        return [*data[:index], child, *data[index + 1:]], f"[{index}]" + (f".{key}" if key else "")
    node = dict(data) if isinstance(data, dict) else {}
    child, key = _set_in_list(node.get(head), rest, value, dotted)
    if isinstance(child, dict) and isinstance(node.get(head), dict) and not rest:
        child = _merge_data(node[head], child)
    node[head] = child
    return node, head + (("" if key.startswith("[") else ".") + key if key else "")


# --------------------------------------------------------------------------- typing


def build_dataclass(cls: type, data: dict, sources: dict[str, str], prefix: str = "") -> Any:
    """Instantiate dataclass `cls` from a mapping, checking every key and every type."""
    if not isinstance(data, dict):
        raise ConfigError(source_of(sources, prefix.rstrip(".")), prefix.rstrip("."),
                          f"expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = _type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    for key in data:
        if key not in names:
            dotted = f"{prefix}{key}"
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            raise ConfigError(source_of(sources, dotted), dotted,
                              f"unknown key{hint}; {cls.__name__} accepts: {', '.join(names)}")
    required = [f.name for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        where = prefix.rstrip(".")
        raise ConfigError(source_of(sources, where), where or cls.__name__,
                          f"missing required key(s) {', '.join(missing)} of {cls.__name__}")
    kwargs = {key: coerce(hints[key], value, sources, f"{prefix}{key}") for key, value in data.items()}
    for f in (f for f in dataclasses.fields(cls) if f.name in kwargs):  # each in its domain (utils.domains)
        for key, problem in field_problems(f, kwargs[f.name], f"{prefix}{f.name}"):
            raise ConfigError(source_of(sources, key), key, problem)
    return cls(**kwargs)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A dataclass's field types, evaluated once (evaluating its annotations was most of a read)."""
    return typing.get_type_hints(cls)


def coerce(tp: Any, value: Any, sources: dict[str, str], dotted: str) -> Any:
    """Check `value` against type hint `tp` (int, float, str, bool, Optional, list, Literal, dataclass)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(arg, value, sources, dotted)
            except ConfigError as err:
                errors.append(err.message)
        raise ConfigError(source_of(sources, dotted), dotted, " or ".join(errors))
    if origin is Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(args):  # YAML 1.1 reads bare on/off as booleans
            value = "on" if value else "off"
        if any(value == a and type(value) is type(a) for a in args):  # True is not the stage 1
            return value
        raise ConfigError(source_of(sources, dotted), dotted,
                          f"expected one of {', '.join(map(repr, args))}, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(source_of(sources, dotted), dotted, f"expected a list, got {_describe(value)}")
        item_types = args if origin is tuple and Ellipsis not in args else (args[0],) * len(value)
        if len(item_types) != len(value):
            raise ConfigError(source_of(sources, dotted), dotted,
                              f"expected a list of {len(item_types)} items, got {len(value)}")
        items = [coerce(t, v, sources, f"{dotted}[{i}]") for i, (t, v) in enumerate(zip(item_types, value))]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(tp):
        return build_dataclass(typing.cast(type, tp), value if value is not None else {}, sources, f"{dotted}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer beyond any float
                raise ConfigError(source_of(sources, dotted), dotted,
                                  f"expected a finite number, got {huge_integer(int(value))}") from None
        if isinstance(value, str) and _YAML12_FLOAT.fullmatch(value):  # 1e-4: a float in YAML 1.2, not in 1.1
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    else:
        raise TypeError(f"unsupported config type {tp!r} for {dotted}")
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[tp]
    raise ConfigError(source_of(sources, dotted), dotted, f"expected {expected}, got {_describe(value)}")


def to_dict(obj: Any) -> Any:
    """Dataclass tree -> plain YAML-serialisable data."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def source_of(sources: dict[str, str], dotted: str) -> str:
    """The file that set `dotted`, its nearest enclosing key, or its first sub-key ("" if none).
    A list element's key (`phases[1].tol`) is looked up as it is, then for the list as a whole."""
    exact = dotted
    while "[" in exact:
        if exact in sources:
            return sources[exact]
        below = [v for k, v in sources.items() if k.startswith(exact + ".")]
        if below:
            return below[-1]
        exact = exact.rsplit(".", 1)[0] if "." in exact.split("]")[-1] else exact.rsplit("[", 1)[0]
    key = re.sub(r"\[\d+\]", "", dotted)
    while key:
        if key in sources:
            return sources[key]
        below = [v for k, v in sources.items() if k.startswith(key + ".")]
        if below:
            return below[-1]
        key = key.rsplit(".", 1)[0] if "." in key else ""
    return ""


def _describe(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"
