"""DeepSpeed and megatron-core come in without MLflow, W&B and the compiler (utils/lean_imports.py),
which a run imports itself where it uses them; every import of them in the project goes through it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import sys
from implicit_megatron.train.engine import init_distributed
from data_pipeline.packed import build_packed_dataset
from implicit_megatron.utils.lean_imports import import_deepspeed, import_megatron_datasets
import_deepspeed(); import_megatron_datasets()
import deepspeed, megatron.core.datasets.gpt_dataset
print(sorted(m for m in ("mlflow", "wandb", "torch._dynamo", "torch._inductor") if m in sys.modules))
import mlflow, wandb  # hidden only while those imported: a run that tracks imports them as usual
import torch
plain = lambda x: x + 1
compiled = torch.compile(plain)  # torch.compile is itself again after megatron-core's import
print(mlflow.__name__, wandb.__name__, deepspeed.accelerator.get_accelerator().device_name(),
      compiled is not plain, "torch._dynamo" in sys.modules)
"""


@pytest.mark.processes
def test_deepspeed_and_megatron_come_without_mlflow_wandb_or_the_compiler():
    """megatron-core compiles its fused kernels at import: Dynamo and Inductor stay out until asked."""
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-2:] == ["[]", "mlflow wandb cpu True True"]


def test_every_import_of_deepspeed_or_megatron_goes_through_lean_imports():
    """A plain `import deepspeed` reached first would bring MLflow back into every rank's start-up
    (and into the tools' and the test workers' processes)."""
    direct = re.compile(r"^\s*(import|from) (deepspeed|megatron)\b", re.MULTILINE)
    through = {"deepspeed": "import_deepspeed()", "megatron": "import_megatron()"}
    missing = []
    for path in [*ROOT.glob("implicit_megatron/**/*.py"), *ROOT.glob("data_pipeline/**/*.py"),
                 *ROOT.glob("tools/**/*.py"), *ROOT.glob("tests/distributed/workers/*.py")]:  # processes of their own
        text = path.read_text()
        for package in {m.group(2) for m in direct.finditer(text)}:
            if through[package] not in text and path.name != "lean_imports.py":
                missing.append(f"{path.relative_to(ROOT)}: {package}")
    assert missing == []
