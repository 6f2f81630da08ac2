"""The CPU emulation of CUDA graphs keeps the semantics the graph path depends on."""

from __future__ import annotations

import pytest
import torch
from support.cuda_graph_emulation import CaptureError, EmulatedGraph, emulated


@pytest.fixture(autouse=True)
def _emulation():
    with emulated():
        yield


def test_capture_computes_nothing_and_replay_reads_inputs_by_address():
    x, w, log = torch.randn(3), torch.randn(3), torch.zeros(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * w + 1
        log.add_(1)  # a write to memory the graph does not own
    assert torch.isnan(y).all() and log.item() == 0  # nothing ran: outputs hold garbage
    graph.replay()
    assert torch.equal(y, x * w + 1) and log.item() == 1
    x.copy_(torch.arange(3.0))  # new values at the same address reach the replay
    w.mul_(2)
    out = y
    graph.replay()
    assert y is out and torch.equal(y, torch.arange(3.0) * w + 1) and log.item() == 2


def test_a_new_tensor_is_not_seen_and_a_freed_one_is_refused():
    x = torch.randn(4)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x.sin()
    x = torch.zeros(4)  # rebinding the name frees the captured input: the graph cannot know
    with pytest.raises(RuntimeError, match="replay reads freed memory"):
        graph.replay()
    del y


def test_host_synchronisation_and_nested_capture_are_refused():
    x = torch.randn(4)
    with pytest.raises(CaptureError, match="not permitted when stream is capturing"), \
            torch.cuda.graph(torch.cuda.CUDAGraph()):
        x.sum().item()
    assert not torch.cuda.is_current_stream_capturing()
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        with pytest.raises(CaptureError, match="already being captured"):
            torch.cuda.CUDAGraph().capture_begin()
        x.cos()


REFUSED_IN_A_CAPTURE = {  # what a GPU refuses while a stream is captured, and the emulation with it
    "Tensor.cpu": lambda x: x.cpu(),
    "Tensor.tolist": lambda x: x.tolist(),
    "Tensor.numpy": lambda x: x.numpy(),
    "bincount": lambda x: torch.bincount(x.long()),
    "torch.cuda.synchronize": lambda x: torch.cuda.synchronize(),
    "Stream.synchronize": lambda x: torch.cuda.current_stream().synchronize(),
    "a tensor from Python data": lambda x: torch.tensor([1.0, 2.0]),
}


@pytest.mark.parametrize("what", list(REFUSED_IN_A_CAPTURE))
def test_host_reads_and_host_copies_are_refused_in_a_capture(what):
    x = torch.arange(4.0)
    REFUSED_IN_A_CAPTURE[what](x)  # allowed outside a capture
    with pytest.raises(CaptureError, match="not permitted when stream is capturing"), \
            torch.cuda.graph(torch.cuda.CUDAGraph()):
        REFUSED_IN_A_CAPTURE[what](x)
    assert not torch.cuda.is_current_stream_capturing()


def test_the_current_stream_is_the_one_made_current_and_a_failed_capture_leaves_the_side_stream():
    before = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() is side
    assert torch.cuda.current_stream() is before
    EmulatedGraph.fail_capture_end = True
    with pytest.raises(CaptureError, match="invalidated"), torch.cuda.graph(torch.cuda.CUDAGraph()):
        assert torch.cuda.current_stream() is not before  # captures run on a side stream
        torch.arange(3.0).cos()
    assert torch.cuda.current_stream() is not before  # torch's context did not go back (graphs.capture does)
    torch.cuda.set_stream(before)


def test_backward_is_captured_and_replayed():
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    grad_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(grad_graph):
        (grad,) = torch.autograd.grad((x @ w).tanh().sum(), w)
    grad_graph.replay()
    expected = torch.autograd.grad((x @ w).tanh().sum(), w)[0]
    assert torch.allclose(grad, expected)


def test_torch_make_graphed_callables_runs_on_it_with_its_gradient_aliasing():
    """torch's own make_graphed_callables, run unchanged: the gradient it returns for a parameter
    is a view of the graph's buffer, which autograd adopts as p.grad, so accumulating two
    backwards doubles the second instead of adding the first (the known PyTorch problem)."""
    layer = torch.nn.Linear(3, 1)
    graphed = torch.cuda.make_graphed_callables(layer, (torch.randn(2, 3),))
    a, b = torch.randn(2, 3), 3 * torch.randn(2, 3)
    graphed(a).sum().backward()
    graphed(b).sum().backward()
    # d/dW of sum(x W^T + bias) is the sum of x's rows
    assert torch.allclose(layer.weight.grad, 2 * b.sum(0, keepdim=True))
    assert not torch.allclose(layer.weight.grad, (a + b).sum(0, keepdim=True))
