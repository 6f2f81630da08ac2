"""launch/pretrain.sh and launch/curriculum.sh stay front doors: they find or set up the Python and
hand over to the launch in Python, where run control has its one owner (docs/training.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[3] / "launch"


@pytest.mark.parametrize("script,module", [("pretrain.sh", "implicit_megatron.launch"),
                                           ("curriculum.sh", "implicit_megatron.launch.curriculum")])
def test_a_front_door_is_at_most_40_lines_and_ends_in_the_python_launch(script, module):
    lines = [line.strip() for line in (LAUNCH / script).read_text().splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    assert len(code) <= 40, f"{script}: {len(code)} lines that are not comments; run control belongs in Python"
    assert code[-1] == f'exec "$PYTHON" -m {module} "$@"'
    control = ("setsid", "awk", "kill ", "wait ", "torchrun", "--num_gpus")  # the launch's own work, in Python
    assert not any(word in line for line in code for word in control)
