"""What several multi-process tests read: one reference run, trained once per test run."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import run_torchrun
from support.reference_runs import TINY, zero1_overrides
from support.shared import built_once


@pytest.fixture(scope="session")
def zero1_run(shakespeare_shards, tmp_path_factory) -> Path:
    """The run folder of ZERO1_RUN, straight through: the losses that resumes of the same run must
    repeat. Tests read it, or copy it before they write into it."""

    def train(folder: Path) -> None:
        result = run_torchrun("-m", "implicit_megatron.train", TINY, *zero1_overrides(shakespeare_shards, folder))
        first = result.stdout.find("Traceback")  # the rank that failed first, before the others' echoes of it
        assert result.returncode == 0, (result.stdout[first:first + 4000] if first >= 0 else "") + "\n...\n" + \
            result.stdout[-3000:]

    return built_once(tmp_path_factory, "zero1-run", train)
