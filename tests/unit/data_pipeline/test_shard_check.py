"""Shards are checked before launch and when opened: a cut `.bin`, an edited or garbled `.idx` and a
mistyped prefix are refused naming the file, never trained on."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.build import builds_from_source
from data_pipeline.indexed import document_lengths
from data_pipeline.packed import build_packed_dataset
from data_pipeline.shard_check import HEADER_BYTES, ShardError, check_shard, file_sha256
from data_pipeline.shard_check import main as shard_check_main
from implicit_megatron import load_config
from implicit_megatron.utils.typed_yaml import ConfigError

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "configs/tiny/mamba2-explicit.yaml"


@pytest.fixture
def shards(shakespeare_shards, tmp_path) -> str:
    """A private copy of the bundled corpus's shards, to damage."""
    source = Path(shakespeare_shards)
    for path in source.parent.glob(source.name + "_*"):
        if path.is_file():
            shutil.copy(path, tmp_path / path.name)
    return str(tmp_path / source.name)


def refused_before_launch(prefix: str, *extra: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(TINY, [f"data.prefixes=[{prefix}]", "data.source=null", *extra], check_data=True)
    assert info.value.key == "data.prefixes[0]"
    return info.value


def refused_at_open(prefix: str) -> ShardError:
    with pytest.raises(ShardError) as info:
        build_packed_dataset([prefix], None, "train", seq_len=64, seed=1, num_samples=8,
                             cache_dir=str(Path(prefix).parent / "cache"))
    return info.value


def test_whole_shards_pass_and_count_what_megatron_reads(shards):
    info = check_shard(shards + "_train")
    assert info.tokens == int(document_lengths(shards + "_train").sum()) and info.documents > 700
    load_config(TINY, [f"data.prefixes=[{shards}]", "data.source=null"], check_data=True)


def test_a_cut_bin_is_refused_by_name(shards):
    data = Path(shards + "_train.bin")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    for err in (refused_before_launch(shards).message, str(refused_at_open(shards))):
        assert f"{data}:" in err and "cut short" in err


def test_an_index_with_raised_sizes_is_refused_by_name(shards):
    idx = Path(shards + "_train.idx")
    raw = bytearray(idx.read_bytes())
    sequences = struct.unpack("<Q", raw[18:26])[0]
    lengths = np.frombuffer(raw, dtype=np.int32, count=sequences, offset=HEADER_BYTES).copy() + 5000
    raw[HEADER_BYTES:HEADER_BYTES + 4 * sequences] = lengths.tobytes()
    idx.write_bytes(bytes(raw))
    for err in (refused_before_launch(shards).message, str(refused_at_open(shards))):
        assert f"{idx}: document offsets do not follow from the lengths" in err


def test_a_garbled_index_is_refused_by_name(shards):
    idx = Path(shards + "_train.idx")
    raw = bytearray(idx.read_bytes())
    raw[18:26] = bytes(range(200, 208))  # the sequence count
    idx.write_bytes(bytes(raw))
    for err in (refused_before_launch(shards).message, str(refused_at_open(shards))):
        assert f"{idx}:" in err and "garbled" in err


def test_a_mistyped_prefix_is_refused_with_or_without_a_source(shards):
    typo = shards + "x"
    err = refused_before_launch(typo)
    assert f"no shards for {typo!r}" in err.message and "python -m data_pipeline.preprocess" in err.message
    err = refused_before_launch(typo, "data.source=data/corpus/shakespeare.jsonl.zst")
    assert f"no shards for {typo!r}" in err.message  # the corpus is built only into data/cache/
    assert builds_from_source("data/cache/shakespeare/neox") and not builds_from_source(typo)


def test_a_split_too_small_for_one_sample_is_refused(shards):
    err = refused_before_launch(shards, "data.seq_len=100000000")
    assert "holds" in err.message and "fewer than one sample" in err.message


def test_a_cache_folder_this_user_cannot_write_is_refused_before_launch(tmp_path, monkeypatch):
    """A container's user that does not own the mounted data/cache: named before any process starts,
    not a traceback from the first rank's tokenization. (Root may write anywhere, so the refusal of
    write access is the one thing stood in for.)"""
    import os

    cache = tmp_path / "data" / "cache"
    cache.mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != cache and real_access(path, mode))
    err = refused_before_launch(str(cache / "shakespeare" / "neox"), "data.source=data/corpus/shakespeare.jsonl.zst")
    assert f"{cache} is not writable by this user (uid {os.getuid()})" in err.message
    assert "USER_UID" in err.message


def test_an_unfinished_build_is_refused_by_name_with_the_command_that_finishes_it(shards):
    """Shards whose stats record an incomplete build (an input cut short), or published by a run
    killed before its stats (its work folder left), are refused before launch and when opened;
    shards of another tool (no stats, no work folder) are not."""
    import json

    stats_path = Path(shards + "_stats.json")
    stats = json.loads(stats_path.read_text())
    stats_path.write_text(json.dumps({**stats, "incomplete": True, "skipped": {"unreadable_file": 1}}))
    err = refused_before_launch(shards)
    assert f"{stats_path}: the build of these shards is incomplete" in str(err)
    assert f"python -m data_pipeline.preprocess --input {stats['inputs'][0]} --tokenizer" in str(err)
    assert f"--output-prefix {shards} --append-eod --valid-fraction 0.05 --test-fraction 0.05" in str(err)
    with pytest.raises(ShardError, match="incomplete"):
        build_packed_dataset([shards], None, "train", 64, seed=1)
    stats_path.unlink()
    Path(shards + ".work").mkdir()
    assert "ended before writing" in str(refused_before_launch(shards))
    Path(shards + ".work").rmdir()
    load_config(TINY, [f"data.prefixes=[{shards}]", "data.source=null"], check_data=True)  # another tool's


def test_shards_built_from_another_source_are_refused_before_launch(tmp_path, write_jsonl):
    """data.source names another file than the one the shards under data/cache/ were built from:
    named (data.source, both files) before any process starts, nothing rebuilt."""
    from data_pipeline.build import ensure_shards

    built = write_jsonl(tmp_path / "built.jsonl", [{"text": f"to be or not to be, {i} " * 20} for i in range(40)])
    other = write_jsonl(tmp_path / "other.jsonl", [{"text": "that is the question"}] * 40)
    prefix = str(tmp_path / "data" / "cache" / "mine" / "neox")
    tokenizer = str(ROOT / load_config(TINY).data.tokenizer)
    ensure_shards(str(built), prefix, tokenizer, 0.1, 0.0, workers=0, progress=False)
    with pytest.raises(ConfigError) as info:
        load_config(TINY, [f"data.prefixes=[{prefix}]", f"data.source={other}", f"data.tokenizer={tokenizer}",
                           "data.seq_len=16"], check_data=True)
    assert info.value.key == "data.source" and f"built from {built}" in info.value.message
    assert f"data.source is {other}" in info.value.message
    load_config(TINY, [f"data.prefixes=[{prefix}]", f"data.source={built}", f"data.tokenizer={tokenizer}",
                       "data.seq_len=16"], check_data=True)


def test_the_command_that_finishes_a_build_is_quoted_and_holds_no_control_characters():
    """A received `_stats.json` writes part of the command the error asks the user to paste: every
    value is one quoted word, and escapes that would rewrite the terminal are dropped."""
    import shlex

    from data_pipeline.shard_check import preprocess_command

    command = preprocess_command("data/x", {"inputs": ["a b.jsonl", "$(touch marker).jsonl"],
                                            "tokenizer": "tok\x1b[2J;rm -rf ~", "text_key": "t\nx"})
    assert "\x1b" not in command and "\n" not in command
    assert shlex.split(command) == ["python", "-m", "data_pipeline.preprocess", "--input", "a b.jsonl",
                                    "$(touch marker).jsonl", "--tokenizer", "tok[2J;rm -rf ~", "--output-prefix",
                                    "data/x", "--text-key", "tx"]


@pytest.mark.parametrize("code", [6, 7])
def test_an_index_whose_dtype_says_floats_is_refused_by_name(shards, code):
    """A `.idx` whose dtype code says float64 (or float32) passed where the `.bin`'s size fit, and
    evaluation ended in a cast error naming no shard: token ids are integers."""
    idx = Path(shards + "_train.idx")
    raw = bytearray(idx.read_bytes())
    raw[17] = code  # after the magic (9) and the version (8)
    idx.write_bytes(bytes(raw))
    name = {6: "float64", 7: "float32"}[code]
    for err in (refused_before_launch(shards).message, str(refused_at_open(shards))):
        assert f"{idx}: token dtype code {code} is {name}; token ids are integers" in err


def stats_of(prefix: str) -> dict:
    return json.loads(Path(prefix + "_stats.json").read_text())


def flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_every_shard_files_sha256_is_recorded_and_verify_sees_a_flipped_bit(shards, capsys):
    """The digests are taken while the files are written; a flipped bit keeps every size and every
    offset, so only a digest sees it: `shard_check --verify` and data.verify_shards do, naming it."""
    files = stats_of(shards)["files"]
    folder = Path(shards).parent
    assert set(files) == {p.name for p in folder.glob(Path(shards).name + "_*") if p.suffix in (".bin", ".idx")}
    for name, record in files.items():
        assert record == {"bytes": (folder / name).stat().st_size, "sha256": file_sha256(str(folder / name))}
    assert shard_check_main([shards, "--verify"]) == 0 and "digests verified" in capsys.readouterr().out
    data = Path(shards + "_train.bin")
    flip_a_bit(data)
    assert shard_check_main([shards]) == 0
    load_config(TINY, [f"data.prefixes=[{shards}]", "data.source=null"], check_data=True)
    assert shard_check_main(["--verify", shards]) == 1
    said = capsys.readouterr().err
    assert said.startswith(f"error: {data}: its content is not what {shards}_stats.json records"), said
    assert f"{data}: its content is not what" in refused_before_launch(shards, "data.verify_shards=true").message


def test_a_shard_file_added_or_replaced_after_the_build_is_refused_by_name(shards):
    for ext in (".bin", ".idx"):
        shutil.copy(shards + "_train" + ext, shards + "_train_00007" + ext)
    added = f"{shards}_train_00007.bin: a shard file that {shards}_stats.json does not list"
    assert added in refused_before_launch(shards).message and added in str(refused_at_open(shards))
    for ext in (".bin", ".idx"):
        Path(shards + "_train_00007" + ext).unlink()
        shutil.copy(shards + "_test" + ext, shards + "_valid" + ext)  # whole shards, other sizes
    replaced = f"{shards}_valid.bin: "
    err = refused_before_launch(shards).message
    assert err.startswith(replaced) and f"but {shards}_stats.json records" in err


def test_stats_without_digests_check_by_shard_and_verify_says_there_is_nothing_to_verify(shards, capsys):
    stats = stats_of(shards)
    del stats["files"]
    Path(shards + "_stats.json").write_text(json.dumps(stats))
    assert shard_check_main([shards]) == 0
    assert shard_check_main([shards, "--verify"]) == 1
    assert "records no digests of its shard files" in capsys.readouterr().err
    stats["files"] = {"../../../etc/passwd": {"bytes": 1, "sha256": "0" * 64}}
    Path(shards + "_stats.json").write_text(json.dumps(stats))
    assert "'../../../etc/passwd', not a shard file of" in refused_before_launch(shards).message
