"""Limits on config files and overrides from someone else: a few bytes cannot exhaust memory or end in a
traceback; each is refused in one ConfigError naming the file (or the command line) and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from implicit_megatron import load_config
from implicit_megatron.utils.typed_yaml import MAX_BASE_DEPTH, MAX_BASE_READS, MAX_CONFIG_BYTES, ConfigError

TINY = Path(__file__).resolve().parents[3] / "configs" / "tiny" / "mamba2-implicit.yaml"


def refused(path: Path | str, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides), check_files=False)
    return info.value


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(f"base: {TINY}\n" + "\n".join(levels) + "\n")
    assert bomb.stat().st_size < 1000  # 9^9 leaves when walked
    err = refused(bomb)
    assert err.source == str(bomb) and "aliases (*name) are not accepted" in str(err)


def test_an_integer_of_thousands_of_digits_is_named(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(f"base: {TINY}\ntrain:\n  steps: {'9' * 5000}\n")
    assert refused(big).source == str(big)
    err = refused(TINY, f"train.steps={'9' * 5000}")
    assert err.source == "command line" and err.key == "train.steps"


def test_nesting_deeper_than_the_parser_goes_is_named(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("train: " + "[" * 100_000 + "]" * 100_000 + "\n")
    err = refused(deep)
    assert err.source == str(deep) and "nested too deeply" in str(err)


def test_a_long_base_chain_and_a_large_file_are_refused_before_they_are_read(tmp_path):
    previous = TINY
    for i in range(MAX_BASE_DEPTH + 5):
        path = tmp_path / f"c{i}.yaml"
        path.write_text(f"base: {previous}\n")
        previous = path
    assert f"more than {MAX_BASE_DEPTH} files" in str(refused(previous))
    large = tmp_path / "large.yaml"
    with large.open("w") as out:
        out.write(f"base: {TINY}\n#" + "x" * MAX_CONFIG_BYTES + "\n")
    err = refused(large)
    assert err.source == str(large) and f"a config is at most {MAX_CONFIG_BYTES}" in str(err)


def test_a_fan_out_of_bases_is_refused_by_the_reads_in_all_not_only_the_depth(tmp_path):
    """Each file naming the next one 4 times: 4 levels deep (within the depth limit), 4^4 reads of the
    last (the issue's 12 times took minutes at this depth; 4 keep this test short with the bound taken away)."""
    (tmp_path / "f4.yaml").write_text(f"base: {TINY}\n")
    for level in range(3, -1, -1):
        (tmp_path / f"f{level}.yaml").write_text(f"base: [{', '.join([f'f{level + 1}.yaml'] * 4)}]\n")
    err = refused(tmp_path / "f0.yaml")
    assert err.key == "base" and f"more than {MAX_BASE_READS} files to read in all" in err.message
    assert f"{tmp_path / 'f0.yaml'} -> {tmp_path / 'f1.yaml'}" in err.message  # the chain where it stopped
    assert load_config(TINY, check_files=False).name  # the project's own chains read far fewer


@pytest.mark.parametrize("text, line, key", [
    ("train:\n  steps: 20\n  log_interval: 1\n  steps: 40\n", 4, "steps"),
    ("name: a\ntrain: {steps: 2}\nname: b\n", 3, "name"),
    ("curriculum:\n  phases:\n    - {name: x, kind: bounded, fraction: 1, max_iter: 2, max_iter: 3}\n", 3,
     "max_iter")])
def test_a_key_given_twice_in_one_mapping_is_refused_naming_the_file_line_and_key(tmp_path, text, line, key):
    path = tmp_path / "twice.yaml"
    path.write_text(f"base: {TINY}\n{text}")
    err = refused(path)
    assert err.source == str(path) and f"the key {key!r} is given twice in one mapping" in err.message
    assert f"line {line + 1}, column " in err.message  # the second one (after the base line)
    assert "\n" not in err.message  # one line: where, and what
    top = tmp_path / "top.yaml"
    top.write_text("base: twice.yaml\n")
    assert refused(top).source == str(path)  # in a base file too
    err = refused(TINY, "train={steps: 2, steps: 3}")
    assert err.source == "command line" and "the key 'steps' is given twice" in err.message


def test_an_override_without_a_key_is_named():
    err = refused(TINY, "=3")
    assert err.source == "command line" and "the key is empty" in str(err)
