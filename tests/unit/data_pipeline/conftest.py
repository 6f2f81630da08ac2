"""Shared data for the data-pipeline tests: the bundled corpus, the GPT-NeoX tokenizer, helpers
that write inputs and read shards back with megatron-core's own reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
NEOX = REPO / "data" / "tokenizers" / "gpt-neox-20b.json.xz"
CORPUS = REPO / "data" / "corpus" / "shakespeare.jsonl.zst"


@pytest.fixture(scope="session")
def neox_path() -> str:
    return str(NEOX)


@pytest.fixture(scope="session")
def neox():
    from data_pipeline.tokenizer import load_tokenizer

    return load_tokenizer(NEOX)


@pytest.fixture(scope="session")
def corpus_path() -> str:
    return str(CORPUS)


@pytest.fixture(scope="session")
def corpus() -> list[dict]:
    """The bundled corpus: 801 scene-level documents."""
    import zstandard

    with open(CORPUS, "rb") as handle:
        lines = zstandard.ZstdDecompressor().stream_reader(handle).read().decode("utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="session")
def small_texts(corpus) -> list[str]:
    """Short real documents (the first 400 characters of 60 scenes): quick to tokenize."""
    return [doc["text"][:400] for doc in corpus[:60]]


@pytest.fixture
def write_jsonl():
    def write(path: Path, records: list) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path

    return write


@pytest.fixture(scope="session")
def read_split():
    """Documents of every shard of `{prefix}_{split}`, read with megatron-core's IndexedDataset."""
    from data_pipeline.indexed import find_shards, megatron_indexed

    indexed_cls, _ = megatron_indexed()

    def read(prefix: str, split: str) -> list[list[int]]:
        try:
            shards = find_shards(prefix, split)
        except FileNotFoundError:  # a split without documents has no file
            return []
        docs: list[list[int]] = []
        for shard in shards:
            dataset = indexed_cls(shard)
            docs.extend(np.asarray(dataset[i]).tolist() for i in range(len(dataset)))
            del dataset
        return docs

    return read


@pytest.fixture(scope="session")
def expected_split_docs():
    """What preprocessing must write: each good text tokenized (+ EOD) in its hashed split."""
    from data_pipeline.splits import SPLITS, split_of

    def expected(tokenizer, texts: list[str], valid: float, test: float, eod: bool = True):
        out: dict[str, list[list[int]]] = {s: [] for s in SPLITS}
        for text in texts:
            ids = tokenizer.encode(text) + ([tokenizer.eod_id] if eod else [])
            out[split_of(text.encode("utf-8"), valid, test)].append(ids)
        return out

    return expected


@pytest.fixture(scope="session")
def run_cli():
    """Run `python -m MODULE ARGS` from the repository root; returns the finished process."""

    def run(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=timeout)

    return run


def shard_bytes(prefix: str) -> dict[str, bytes]:
    """Every .bin/.idx file of an output prefix, by name relative to the prefix."""
    folder, stem = os.path.split(prefix)
    return {name[len(stem):]: Path(folder, name).read_bytes() for name in sorted(os.listdir(folder))
            if name.startswith(stem + "_") and name.endswith((".bin", ".idx"))}


@pytest.fixture(scope="session")
def output_bytes():
    return shard_bytes
