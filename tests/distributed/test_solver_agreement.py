"""Under ZeRO-3, ranks whose batches converge at different speeds run the same number of passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import run_torchrun

WORKERS = Path(__file__).parent / "workers"


@pytest.mark.distributed
def test_ranks_agree_on_passes_under_zero3():
    result = run_torchrun(WORKERS / "solver_agreement.py")
    assert result.returncode == 0, result.stdout[-6000:]
    assert "solver agreement OK" in result.stdout
