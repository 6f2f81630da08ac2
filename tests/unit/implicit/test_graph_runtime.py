"""The CUDA-graph runtime (implicit/graph_runtime.py) on the CPU emulation of CUDA graphs: a failed
capture, eviction past the cache's limit, a weight that moves, a graph that computes something else.
Each ends in eager passes that give what the eager core gives, or in an error that says why."""

from __future__ import annotations

import logging

import pytest
import torch
from support.cuda_graph_emulation import emulated
from support.graph_models import MODES, batches, graph_model, train


def auto_after_an_eager_loss(make_model):
    """A graph model (in an emulation already entered), a micro-batch and its eager loss; graphs "auto"."""
    model = graph_model(make_model, "mamba2", ("cpu", torch.float64))
    ids = batches("cpu", 1)[0]
    model.core.cuda_graphs = "off"
    expected = model(ids, labels=ids).item()
    model.core.cuda_graphs = "auto"
    return model, ids, expected


def test_a_failed_capture_frees_the_graphs_runs_eagerly_and_says_why(make_model, monkeypatch, caplog):
    """The passes with gradient cannot be captured (a host synchronisation inside): the weights'
    and solver's graphs, captured just before, are freed, and the core runs eagerly."""
    with emulated():
        model, ids, expected = auto_after_an_eager_loss(make_model)
        backbone_forward = type(model.core.backbone).forward

        def syncing(self, z, inj=None, seq_idx=None):
            if torch.is_grad_enabled() and torch.cuda.is_current_stream_capturing():
                z.sum().item()
            return backbone_forward(self, z, inj, seq_idx)

        monkeypatch.setattr(type(model.core.backbone), "forward", syncing)
        with caplog.at_level(logging.WARNING, logger="implicit_megatron.implicit.graph_runtime"):
            assert model(ids, labels=ids).item() == expected  # first sight: eager
            assert model(ids, labels=ids).item() == expected  # capture fails: eager
        assert not model.core.graphs.cache and model.core.cuda_graphs == "off"
        assert [r.getMessage() for r in caplog.records] == [
            "CUDA graph capture failed (CaptureError: operation not permitted when stream is capturing "
            "(aten._local_scalar_dense.default): a host synchronisation inside a CUDA graph capture); "
            "the passes run eagerly"]
        model.core.cuda_graphs = "on"
        with pytest.raises(RuntimeError, match="stream is capturing"):
            model(ids, labels=ids)
        assert not model.core.graphs.cache and not torch.cuda.is_current_stream_capturing()


@pytest.mark.slow  # over 10 s on 2 cores: the full tier runs it
def test_graphs_evicted_for_many_shapes_never_read_stale_weights(make_model):
    """Training at one length between evaluations at six others (solver rule, each length twice,
    in one order and then in the other) fills the graph cache past its limit: the shapes' graphs are
    evicted, and no solver graph may then read a weights' graph that was dropped, frozen at the
    weights of its capture."""
    from dataclasses import replace

    with emulated():
        model = graph_model(make_model, "mamba2", ("cpu", torch.float64), "(4+1)")
        model.core.settings = replace(MODES["(4+1)"], eval_rule="solver", eval_stop="sequence")  # graphable
        eager = graph_model(make_model, "mamba2", ("cpu", torch.float64), "(4+1)")
        eager.load_state_dict(model.state_dict())
        eager.core.settings = model.core.settings
        model.core.cuda_graphs, eager.core.cuda_graphs = "on", "off"
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
        ids = batches("cpu", 1)[0]

        def training_step() -> None:
            losses = []
            for m, optimizer in zip((model, eager), optimizers, strict=True):
                m.train()
                loss = m(ids, labels=torch.roll(ids, -1, 1))
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                losses.append(loss.item())
            assert abs(losses[0] - losses[1]) <= 1e-10 * abs(losses[1]), losses

        for lengths in ([8, 12, 20, 24, 28, 32], [32, 28, 24, 20, 12, 8]) * 2:
            training_step()
            model.eval(), eager.eval()
            with torch.no_grad():
                for length in lengths:
                    for _ in range(2):
                        probe = batches("cpu", 1, length)[0]
                        assert torch.allclose(model(probe), eager(probe), rtol=1e-10, atol=0), length
        training_step()
        assert len(model.core.graphs.cache) <= 8


def test_a_capture_that_fails_at_its_end_leaves_the_run_on_its_own_stream(make_model, caplog):
    """torch.cuda.graph goes back to the caller's stream only when capture_end succeeds; the eager
    fallback, and everything after it, must not run on the capture's side stream."""
    from support.cuda_graph_emulation import EmulatedGraph

    with emulated():
        model, ids, expected = auto_after_an_eager_loss(make_model)
        stream = torch.cuda.current_stream()
        assert model(ids, labels=ids).item() == expected  # first sight: eager
        EmulatedGraph.fail_capture_end = True  # the weights' graph, the first captured, fails at its end
        with caplog.at_level(logging.WARNING, logger="implicit_megatron.implicit.graph_runtime"):
            assert model(ids, labels=ids).item() == expected
        assert model.core.cuda_graphs == "off" and "invalidated" in caplog.text
        assert torch.cuda.current_stream() is stream


def test_a_weight_moved_reshaped_or_weight_normed_later_is_captured_again(make_model):
    """What a replay relies on about each parameter: its address, dtype, shape and strides. A weight
    seen through other strides at the same address, and weight norm applied or removed after graphs
    exist, are captured again (before: replayed with the old layout, or a KeyError)."""
    from implicit_megatron.implicit.weight_norm import apply_weight_norm, remove_weight_norm

    with emulated():
        model = graph_model(make_model, "llama", ("cpu", torch.float64))
        eager = graph_model(make_model, "llama", ("cpu", torch.float64))
        eager.load_state_dict(model.state_dict())
        model.core.cuda_graphs, eager.core.cuda_graphs = "on", "off"
        ids = batches("cpu", 1)[0]

        def same() -> None:
            for _ in range(2):  # a new layout is captured at the second sight
                loss, expected = model(ids, labels=ids), eager(ids, labels=ids)
                assert abs(loss.item() - expected.item()) <= 1e-10 * abs(expected.item())
                loss.backward(), expected.backward()

        same()
        for m in (model, eager):  # the same memory through other strides (a square weight, transposed)
            q = m.core.backbone.layers[0].self_attn.q_proj.parametrizations.weight.original1
            address = q.data_ptr()
            q.data = q.data.t()
            assert q.data_ptr() == address
        same()
        for m in (model, eager):
            remove_weight_norm(m.core.backbone)
        same()
        for m in (model, eager):
            apply_weight_norm(m.core.backbone)
        same()



@pytest.mark.parametrize("wrong", ["solver pass", "gradient"])
def test_a_graph_that_computes_something_else_is_caught_at_its_first_use(make_model, monkeypatch, caplog, wrong):
    """A graph captured without error that computes something else (here: one value of the solver's
    pass, or one parameter's gradient, off by 1e-3 relative): its first use is checked against the
    eager passes on the same micro-batch. "auto" says so with the figures and trains eagerly on,
    with the eager model's losses and gradients; "on" stops with the error."""
    from implicit_megatron.implicit import graphs as graphs_lib

    kind, cls = ("solve", graphs_lib.SolverGraphs) if wrong == "solver pass" else ("grad", graphs_lib.GradGraphs)
    made = cls.__init__

    def tampered(self, *args, **kwargs):
        made(self, *args, **kwargs)
        graph = self.graph if kind == "solve" else self.backward_graph
        out = self.f_z if kind == "solve" else next(g for g in self.grads[2:] if g is not None)
        replay = graph.replay

        def replay_and_drift():
            replay()
            out.view(-1)[0] *= 1.001

        graph.replay = replay_and_drift

    with emulated():
        model = graph_model(make_model, "mamba2", ("cpu", torch.float64))
        state = {k: v.clone() for k, v in model.state_dict().items()}
        data = batches("cpu", 1)
        eager, _ = train(model, "off", data, 3)
        model.load_state_dict(state)
        monkeypatch.setattr(cls, "__init__", tampered)
        with caplog.at_level(logging.WARNING, logger="implicit_megatron.implicit.graph_runtime"):
            checked, _ = train(model, "auto", data, 3)
        for (losses, grads), (eager_losses, eager_grads) in zip(checked, eager, strict=True):
            assert losses == eager_losses
            assert all(torch.equal(grads[name], g) for name, g in eager_grads.items())
        warning = [r.getMessage() for r in caplog.records if "differ" in r.getMessage()]
        assert len(warning) == 1, caplog.text
        what = "the solver's pass" if kind == "solve" else "the passes with gradient"
        assert warning[0].startswith(f"CUDA graphs differ from the eager passes: {what} by ")
        assert "the tolerance for float64 is 1e-10); the passes run eagerly" in warning[0]
        assert model.core.cuda_graphs == "off" and not model.core.graphs.cache
        model.load_state_dict(state)
        with pytest.raises(RuntimeError, match=f"CUDA graphs differ from the eager passes: {what}"):
            train(model, "on", data, 3)


