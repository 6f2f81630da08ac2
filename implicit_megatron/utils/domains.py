"""Each config field's domain, declared once on the field and checked by one validator.

A field declares what it accepts where it is defined, as `d_model: int = domain(768, gt=0)` (a
dataclass field whose metadata holds a Domain): a range (gt, ge, lt, le), its unit, and a noun for
messages ("a seed"); a string that becomes a file name says `name=True`. What every field gets
without saying so: a float is finite, an integer fits in 64 bits, a string holds no control
character. A list or tuple of numbers: the domain holds for each element. The choices of a Literal
and the type itself are the type hint's (utils.typed_yaml.coerce).

`field_problems` is the validator: utils.typed_yaml.build_dataclass runs it on every value a file,
a `base:`, an override or a saved config.json gives, and `domain_problems` walks a whole config
(config.rules.validate, for a config made in code). Rules that relate several fields are not
domains: config.rules and the backbone specs' `check` hold them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from implicit_megatron.utils.names import CONTROL_CHARACTERS, name_problem

METADATA_KEY = "domain"
INT64 = (-(2**63), 2**63 - 1)  # what torch and numpy take as an integer
SEED = {"ge": 0, "le": 2**32 - 1, "what": "a seed"}  # numpy's RandomState takes no other seed
PROBABILITY = {"ge": 0, "le": 1, "what": "a probability"}


@dataclass(frozen=True)
class Domain:
    """What one field accepts beyond its type (all bounds inclusive unless named gt/lt)."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    unit: str = ""  # what the number counts or measures (minutes, steps, tokens)
    what: str = ""  # a noun for the message ("a seed", "a probability"); else "an integer" or "a number"
    name: bool = False  # a string that becomes a file name and part of launch commands (utils.names)

    def bounds(self) -> str:
        """The range as a reader writes it: `> 0`, `in [0, 1)`, `in [1, 65535]` ("" for none)."""
        low = ("(", self.gt) if self.gt is not None else ("[", self.ge) if self.ge is not None else None
        high = (")", self.lt) if self.lt is not None else ("]", self.le) if self.le is not None else None
        if low and high:
            return f"in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
        if low:
            return f"{'>' if low[0] == '(' else '>='} {_number(low[1])}"
        if high:
            return f"{'<' if high[0] == ')' else '<='} {_number(high[1])}"
        return ""

    def text(self, kind: Any) -> str:
        """The domain as the config reference prints it for a field of (element) type `kind`, beyond
        what every field of the type gets (module docstring): "" where nothing more is declared."""
        if kind is str:
            return "a name (letters, digits, `_`, `.`, `-`)" if self.name else ""
        if kind not in (int, float):
            return ""
        return " ".join(p for p in (self.what, self.bounds()) if p) + (f" ({self.unit})" if self.unit else "")

    def problem(self, value: Any) -> str | None:
        """Why `value` is outside this domain (None: inside it). None is the type's to judge."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, str):
            if CONTROL_CHARACTERS.search(value):
                return (f"{value!r} holds a control character: paths and names reach the launch scripts, which "
                        "read them row by row and pass them on command lines")
            return name_problem(value) if self.name else None
        if not isinstance(value, (int, float)):
            return None
        whole = isinstance(value, int)
        inside = ((whole or math.isfinite(value)) and (self.gt is None or value > self.gt)  # NaN is never inside
                  and (self.ge is None or value >= self.ge) and (self.lt is None or value < self.lt)
                  and (self.le is None or value <= self.le))
        if inside and (not whole or INT64[0] <= value <= INT64[1]):
            return None
        noun = self.what or ("an integer" if whole else "a finite number")
        wanted = " ".join(p for p in (noun, self.bounds()) if p)
        if inside:  # only too large for 64 bits
            wanted += " of at most 64 bits"
        shown = value if not whole or abs(value) < 10**30 else huge_integer(int(value))
        return f"expected {wanted}{f' ({self.unit})' if self.unit else ''}, got {shown}"


ANY = Domain()  # the domain of a field that declares none: finite, 64-bit, no control characters


def domain(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, **declared: Any) -> Any:
    """A dataclass field with its domain (Domain's keywords, or a preset such as `**SEED`)."""
    metadata = {METADATA_KEY: Domain(**declared)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def domain_of(f: dataclasses.Field) -> Domain:
    """The domain field `f` declares, or ANY."""
    return f.metadata.get(METADATA_KEY, ANY)


def declares_domain(f: dataclasses.Field) -> bool:
    return METADATA_KEY in f.metadata


def field_problems(f: dataclasses.Field, value: Any, key: str) -> Iterator[tuple[str, str]]:
    """(key, why) for `value` of field `f` outside its domain: the value itself, or each element of a
    list or tuple (`key[i]`). A dataclass inside is its own fields' (domain_problems)."""
    found = domain_of(f)
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = None if dataclasses.is_dataclass(item) else found.problem(item)
            if problem:
                yield f"{key}[{i}]", problem
    elif not dataclasses.is_dataclass(value):
        problem = found.problem(value)
        if problem:
            yield key, problem


def domain_problems(obj: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(key, why) for every field of dataclass `obj`, and of the dataclasses it holds, outside its domain."""
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        key, value = f"{prefix}{f.name}", getattr(obj, f.name)
        yield from field_problems(f, value, key)
        if dataclasses.is_dataclass(value):
            yield from domain_problems(value, f"{key}.")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    yield from domain_problems(item, f"{key}[{i}].")


def huge_integer(value: int) -> str:
    """An integer too long to show, by its size (Python writes out no more than 4,300 digits)."""
    return f"an integer of {len(str(abs(value)))} digits" if value.bit_length() < 14_000 else \
        f"an integer of {value.bit_length()} bits"


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) and not float(value).is_integer() else str(int(value))
