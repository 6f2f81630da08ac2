"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="session")
def shakespeare_shards(tmp_path_factory) -> str:
    """The bundled corpus tokenized with the GPT-NeoX-20B tokenizer: a shard prefix (train/valid/test)."""
    prefix = tmp_path_factory.mktemp("shards") / "neox"
    subprocess.run([sys.executable, "-m", "data_pipeline.preprocess", "--input", "data/corpus/shakespeare.jsonl.zst",
                    "--tokenizer", "data/tokenizers/gpt-neox-20b.json.xz", "--output-prefix", str(prefix),
                    "--workers", "1", "--append-eod", "--valid-fraction", "0.05", "--test-fraction", "0.05"],
                   cwd=ROOT, check=True, capture_output=True)
    return str(prefix)
