"""Sequential generation through mamba_ssm's selective_state_update and the causal_conv1d_update
stand-in = simultaneous mode (the whole sequence at once), and the caller's state is never written."""

from __future__ import annotations

import torch
from support.tools import load_tool

CASES = load_tool("kernel_cases")
TOLERANCE = 2e-5  # float32, a recurrence against the chunked scan: ~3e-7 outputs, ~5e-6 ssm state measured


def test_fused_steps_equal_the_whole_sequence_and_the_pytorch_steps(fused):
    for name, got, expected in CASES.compare_generation(CASES.CPU, "cpu", torch.float32, tokens=5):
        assert CASES.rel_err(got, expected) < TOLERANCE, (name, CASES.rel_err(got, expected))


def test_a_fused_step_leaves_the_state_it_was_given_alone(fused):
    mixer = CASES.Mamba2(16, d_state=8, headdim=16, ngroups=2, chunk_size=8)
    state = mixer.allocate_state(2)
    with torch.no_grad():
        _, state = mixer.step(torch.randn(2, 16), state)
        conv, ssm = state.conv.clone(), state.ssm.clone()
        _, new = mixer.step(torch.randn(2, 16), state)  # a candidate, discarded or kept
    assert torch.equal(state.conv, conv) and torch.equal(state.ssm, ssm)
    assert not torch.equal(new.ssm, ssm)
