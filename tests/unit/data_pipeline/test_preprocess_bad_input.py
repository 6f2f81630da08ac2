"""Bad records are skipped and counted by reason; bad arguments stop the run with exit status 2."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from data_pipeline.pipeline import PreprocessConfig, run_preprocess
from data_pipeline.splits import SPLITS


def test_each_bad_record_class_is_counted_and_skipped(tmp_path, neox, neox_path, small_texts, corpus,
                                                      read_split, expected_split_docs):
    good = small_texts[:6]
    lines = [
        json.dumps({"text": good[0]}).encode(),
        b'{"text": "unterminated',                       # line 2: malformed_json
        json.dumps({"title": "no text"}).encode(),        # line 3: missing_text
        json.dumps({"text": None}).encode(),              # line 4: missing_text
        json.dumps({"text": 42}).encode(),                # line 5: non_string_text
        json.dumps({"text": ["a", "b"]}).encode(),        # line 6: non_string_text
        json.dumps({"text": good[1]}).encode(),
        json.dumps({"text": ""}).encode(),                # line 8: empty_text
        json.dumps({"text": " \n\t "}).encode(),          # line 9: empty_text
        b'{"text": "caf\xe9 au lait"}',                   # line 10: invalid_utf8 (latin-1 byte)
        b'{"text": "lone \\ud800 surrogate"}',            # line 11: invalid_utf8 (unpaired surrogate)
        json.dumps([good[2]]).encode(),                   # line 12: not_an_object
        b"",                                              # line 13: blank line, ignored
        json.dumps({"text": good[2]}).encode(),
    ]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"\n".join(lines) + b"\n")
    # a gzip file cut short: the documents before the cut are kept, the rest is skipped
    scenes = [doc["text"] for doc in corpus[100:300]]  # enough text for several reads before the cut
    whole = gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in scenes).encode())
    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(whole[: len(whole) // 2])
    garbage = tmp_path / "garbage.jsonl.zst"
    garbage.write_bytes(b"this is not zstd data")
    unreadable = tmp_path / "unreadable.jsonl"  # a folder where a file was expected: open() fails
    unreadable.mkdir()
    after = tmp_path / "after.jsonl"
    after.write_text(json.dumps({"text": good[5]}) + "\n")

    prefix = tmp_path / "out" / "neox"
    stats = run_preprocess(PreprocessConfig(
        inputs=[str(p) for p in (mixed, truncated, garbage, unreadable, after)], tokenizer=neox_path,
        output_prefix=str(prefix), append_eod=True, valid_fraction=0.3, test_fraction=0.3, workers=0,
        progress=False))

    assert stats["skipped"] == {"malformed_json": 1, "missing_text": 2, "non_string_text": 2, "empty_text": 2,
                                "invalid_utf8": 2, "not_an_object": 1, "unreadable_file": 3}
    examples = stats["skipped_examples"]
    assert examples["malformed_json"] == [f"{mixed}:line 2"]
    assert examples["missing_text"] == [f"{mixed}:line 3", f"{mixed}:line 4"]
    assert examples["non_string_text"] == [f"{mixed}:line 5", f"{mixed}:line 6"]
    assert examples["empty_text"] == [f"{mixed}:line 8", f"{mixed}:line 9"]
    assert examples["invalid_utf8"] == [f"{mixed}:line 10", f"{mixed}:line 11"]
    assert examples["not_an_object"] == [f"{mixed}:line 12"]
    assert examples["unreadable_file"][1:] == [f"{garbage}:line 1", f"{unreadable}:line 1"]
    assert examples["unreadable_file"][0].startswith(f"{truncated}:line ")
    kept_from_truncated = stats["documents"] - 4
    assert 0 < kept_from_truncated < len(scenes)
    texts = good[:3] + scenes[:kept_from_truncated] + [good[5]]
    expected = expected_split_docs(neox, texts, 0.3, 0.3)
    for split in SPLITS:
        assert read_split(str(prefix), split) == expected[split]


@pytest.mark.processes
@pytest.mark.parametrize("damage", ["missing", "cut short"])
def test_a_missing_or_cut_tokenizer_exits_2_naming_it(tmp_path, run_cli, write_jsonl, neox_path, damage):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": "hello"}])
    tokenizer = tmp_path / "tokenizer.json.xz"
    if damage == "cut short":  # an interrupted copy of the bundled .xz
        tokenizer.write_bytes(Path(neox_path).read_bytes()[:100_000])
    result = run_cli("data_pipeline.preprocess", "--input", str(source), "--tokenizer", str(tokenizer),
                     "--output-prefix", str(tmp_path / "out" / "neox"))
    assert result.returncode == 2
    assert str(tokenizer) in result.stderr and "--tokenizer" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    if damage == "cut short":
        assert "not a whole .xz file" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.processes
def test_unknown_format_and_no_match_exit_2_naming_the_input(tmp_path, run_cli, neox_path):
    odd = tmp_path / "docs.csv"
    odd.write_text("text\nhello\n")
    result = run_cli("data_pipeline.preprocess", "--input", str(odd), "--tokenizer", neox_path,
                     "--output-prefix", str(tmp_path / "out" / "neox"))
    assert result.returncode == 2 and "unknown input format" in result.stderr and str(odd) in result.stderr
    pattern = str(tmp_path / "nothing-*.jsonl")
    result = run_cli("data_pipeline.preprocess", "--input", pattern, "--tokenizer", neox_path,
                     "--output-prefix", str(tmp_path / "out" / "neox"))
    assert result.returncode == 2 and "no input matches" in result.stderr and pattern in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.processes
def test_unwritable_output_exits_2_naming_it(tmp_path, run_cli, neox_path, write_jsonl):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": "hello"}])
    blocker = tmp_path / "a-file"
    blocker.write_text("a file, not a folder")
    prefix = blocker / "shards" / "neox"  # its folder cannot be created, whoever runs this
    result = run_cli("data_pipeline.preprocess", "--input", str(source), "--tokenizer", neox_path,
                     "--output-prefix", str(prefix))
    assert result.returncode == 2
    assert "--output-prefix" in result.stderr and str(blocker) in result.stderr
    assert blocker.read_text() == "a file, not a folder"
    assert sorted(os.listdir(tmp_path)) == ["a-file", "docs.jsonl"]


@pytest.mark.processes
def test_unknown_eod_token_exits_2_naming_it(tmp_path, run_cli, neox_path, write_jsonl):
    source = write_jsonl(tmp_path / "docs.jsonl", [{"text": "hello"}])
    result = run_cli("data_pipeline.preprocess", "--input", str(source), "--tokenizer", neox_path,
                     "--eod-token", "<|no-such-token|>", "--output-prefix", str(tmp_path / "out" / "neox"))
    assert result.returncode == 2
    assert "--eod-token" in result.stderr and "<|no-such-token|>" in result.stderr


@pytest.mark.processes
@pytest.mark.parametrize("suffix", [".zst", ".gz"])
def test_a_cut_compressed_input_exits_1_and_a_rerun_after_repair_equals_a_clean_run(
        suffix, tmp_path, run_cli, neox_path, corpus):
    import zstandard

    text = "".join(json.dumps({"text": doc["text"]}) + "\n" for doc in corpus[:60]).encode()
    whole = zstandard.ZstdCompressor().compress(text) if suffix == ".zst" else gzip.compress(text)
    source = tmp_path / f"corpus.jsonl{suffix}"

    def preprocess(prefix):
        return run_cli("data_pipeline.preprocess", "--input", str(source), "--tokenizer", neox_path,
                       "--output-prefix", str(prefix), "--append-eod", "--valid-fraction", "0.1", "--workers", "0",
                       "--quiet")

    source.write_bytes(whole)
    assert preprocess(tmp_path / "clean" / "neox").returncode == 0
    source.write_bytes(whole[: len(whole) // 2])  # an interrupted download
    cut = preprocess(tmp_path / "out" / "neox")
    assert cut.returncode == 1, cut.stderr
    assert f"could not be read to the end ({source}:line " in cut.stderr and "rerun the same command" in cut.stderr
    source.write_bytes(whole)  # repaired
    again = preprocess(tmp_path / "out" / "neox")
    assert again.returncode == 0, again.stderr
    shards = sorted(p.name for p in (tmp_path / "clean").glob("neox_*") if p.suffix in (".bin", ".idx"))
    assert shards == sorted(p.name for p in (tmp_path / "out").glob("neox_*") if p.suffix in (".bin", ".idx"))
    assert "neox_train.bin" in shards and not (tmp_path / "out" / "neox.work").exists()
    for name in shards:
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name


@pytest.mark.processes
def test_no_document_is_an_error_naming_the_likely_cause(tmp_path, run_cli, neox_path, write_jsonl):
    """A wrong --text-key or an empty corpus used to print `0 documents` and exit 0 without shards."""
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"content": "to be", "id": 1}, {"content": "or not", "id": 2}])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for source, expected in [(wrong, f"preprocess: error: --text-key: none of the 2 records has a 'text' field; the "
                                     f"first record of {wrong} has 'content', 'id': name the text field with "
                                     "--text-key"),
                             (empty, f"preprocess: error: --input: no record in {empty} (empty?); no shard was "
                                     "written")]:
        out = tmp_path / source.stem
        result = run_cli("data_pipeline.preprocess", "--input", str(source), "--tokenizer", neox_path,
                         "--output-prefix", str(out / "neox"), "--workers", "0", "--quiet")
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [expected]
        assert not [p.name for p in out.iterdir() if not p.name.endswith(".lock")]  # no shard, no .work


@pytest.mark.processes
def test_a_memory_limit_too_small_for_torch_is_named_in_one_line(tmp_path, corpus_path):
    """Under `ulimit -v` too small for torch's libraries (which megatron-core's shard writer loads), one
    line that says memory and the limit, not `ImportError: libtorch_cpu.so: failed to map segment`."""
    import resource
    import subprocess
    import sys

    from support.processes import ROOT

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (600 * 2**20, resource.RLIM_INFINITY))

    result = subprocess.run([sys.executable, "-m", "data_pipeline.preprocess", "--input", corpus_path, "--tokenizer",
                             str(ROOT / "data/tokenizers/gpt-neox-20b.json.xz"), "--output-prefix",
                             str(tmp_path / "neox"), "--workers", "1", "--quiet"], cwd=ROOT, capture_output=True,
                            text=True, preexec_fn=limit_memory, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.startswith("preprocess: error: out of memory (torch, which megatron-core's shard reader and "
                                    "writer import, could not be loaded (") and "Traceback" not in result.stderr
    assert "under an address-space limit of 0.59 GiB (ulimit -v 614400)" in result.stderr
    assert not list(tmp_path.glob("neox_*"))  # no shard published
