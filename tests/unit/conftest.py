"""Fixtures of the unit tests that more than one module reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_exports import write_tiny_exports


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> dict[str, Path]:
    """Tiny exported folders (support.tiny_exports), written once; tests must not change them."""
    return write_tiny_exports(tmp_path_factory.mktemp("hf-exports"))
