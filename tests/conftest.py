"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """In-process tests run tiny tensors: a thread pool only adds barriers (seconds per test on a
    busy 2-core machine). Processes the tests start get OMP_NUM_THREADS=1 from support.processes."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _grad_mode_left_as_found():
    """A test (or the tool it calls in-process) that turns autograd off for good breaks every
    later training test with a puzzling 'does not require grad': name the culprit instead."""
    import torch

    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        pytest.fail("autograd was left disabled (torch.set_grad_enabled(False) outside a with-block)")


@pytest.fixture(scope="session")
def shakespeare_shards(tmp_path_factory) -> str:
    """The bundled corpus tokenized with the GPT-NeoX-20B tokenizer: a shard prefix (train/valid/test)."""
    prefix = tmp_path_factory.mktemp("shards") / "neox"
    subprocess.run([sys.executable, "-m", "data_pipeline.preprocess", "--input", "data/corpus/shakespeare.jsonl.zst",
                    "--tokenizer", "data/tokenizers/gpt-neox-20b.json.xz", "--output-prefix", str(prefix),
                    "--workers", "1", "--append-eod", "--valid-fraction", "0.05", "--test-fraction", "0.05"],
                   cwd=ROOT, check=True, capture_output=True)
    return str(prefix)
