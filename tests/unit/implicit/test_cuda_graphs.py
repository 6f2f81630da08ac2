"""CUDA graphs of the passes against the eager passes: on the CPU emulation of CUDA graphs
(tests/support/cuda_graph_emulation.py, float64, every commit) and on a real GPU where there is one
(float32 and bf16). Training steps accumulate micro-batches, zero gradients both ways and update
the weights in place between steps, as DeepSpeed's loop does."""

from __future__ import annotations

import gc

import pytest
import torch
from support.cuda_graph_emulation import emulated, replaying
from support.graph_models import MODES, TARGETS, TOLERANCE, batches, close, graph_model, train
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from implicit_megatron.builder import weight_normed_layers
from implicit_megatron.implicit import SolverSettings
from implicit_megatron.models.loss import linear_cross_entropy


@pytest.fixture(params=TARGETS, ids=lambda t: f"{t[0]}-{str(t[1]).removeprefix('torch.')}")
def target(request):
    """(device, dtype): the CPU emulation of CUDA graphs, or the GPU itself."""
    device, dtype = request.param
    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no GPU")
        yield device, dtype
        return
    with emulated():
        yield "cpu", dtype


@pytest.mark.parametrize("mode", list(MODES))
def test_graphed_training_equals_eager(arch, make_model, target, mode):
    device, dtype = target
    # One micro-batch, gradients zeroed in place; three, gradients set to None (autograd then adopts
    # the first micro-batch's gradient as p.grad). The first forward of a shape runs eagerly, the
    # second captures: three steps of one, two of three, replay captured graphs in either case.
    for micro_batches, set_to_none, steps in [(1, False, 3), (3, True, 2)]:
        model = graph_model(make_model, arch, target, mode)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        data = batches(device, micro_batches)
        eager, eager_passes = train(model, "off", data, steps, set_to_none)
        model.load_state_dict(state)
        graphed, passes = train(model, "on", data, steps, set_to_none)
        assert passes == eager_passes  # the free phase stops where the eager solver stops
        timed = [] if mode == "explicit" else ["solve", "phantom"] * steps * micro_batches
        assert model.core.timer.names == timed  # train.timers sees the graphed solve and phantom passes
        for (losses, grads), (eager_losses, eager_grads) in zip(graphed, eager, strict=True):
            assert all(abs(a - b) <= TOLERANCE[dtype] * abs(b) for a, b in zip(losses, eager_losses, strict=True))
            assert set(grads) == set(eager_grads)
            for name, g in eager_grads.items():
                assert close(grads[name], g, dtype), (micro_batches, set_to_none, name)
        kinds = {key[0] for key in model.core.graphs.cache}
        assert kinds == ({"grad"} if mode == "explicit" else {"norms", "solve", "grad"}), kinds


def test_evaluation_by_the_solver_rule_replays_graphs(arch, make_model, target):
    device, dtype = target
    model = graph_model(make_model, arch, target, "free").eval()
    model.core.settings = SolverSettings(max_iter=8, tol=2e-2, phantom_steps=4, eval_factor=4, eval_rule="solver",
                                         eval_stop="batch")
    ids = batches(device, 1)[0]
    with torch.no_grad():
        model.core.cuda_graphs = "off"
        eager = model(ids)
        passes = model.core.last_stats.passes
        model.core.cuda_graphs = "on"
        graphed = [model(ids) for _ in range(3)][-1]
        assert model.core.last_stats.passes == passes
        assert close(graphed.double(), eager.double(), dtype)
        assert {key[0] for key in model.core.graphs.cache} == {"norms", "solve"}
        model.core.settings = SolverSettings(max_iter=8, tol=2e-2, eval_rule="released")
        model.core.graphs.drop()
        model(ids), model(ids)
        assert not model.core.graphs.cache  # the released rule always runs eagerly
        model.core.settings = SolverSettings(max_iter=8, tol=2e-2, eval_rule="solver", eval_stop="token")
        model(ids), model(ids)
        assert not model.core.graphs.cache  # so does the per-token stop (it reads z after each pass)


def test_no_normalised_weight_outlives_its_forward(make_model, target):
    """Weights normalised outside a capture (eager forwards, the graphs' warm-up) are freed by the
    end of the step: only the graphs' own memory stays. Python weak references would not tell (a
    tensor's Python object dies while autograd still holds the tensor), so storages are watched."""
    model = graph_model(make_model, "mamba2", target)
    made = []

    def watch(module, args, out):
        if not torch.cuda.is_current_stream_capturing():
            made.append(StorageWeakRef(out.untyped_storage()))

    for layer in weight_normed_layers(model.core.backbone):
        layer.parametrizations.weight.register_forward_hook(watch)
    data = batches(target[0], 2)
    train(model, "on", data, steps=2)
    train(model, "off", data, steps=1)
    gc.collect()
    layers = len(weight_normed_layers(model.core.backbone))
    assert len(made) >= 6 * layers  # eager forwards' solve and phantom steps, the warm-ups
    assert all(ref.expired() for ref in made)


class CopyCounter(TorchDispatchMode):
    """The shapes of every copy made outside graph replays."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.copy_.default and not replaying():
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["(4+1)", "(24+4)"])
def test_only_what_changes_is_copied_into_the_graphs(arch, make_model, mode):
    """Per forward: the iterate (once per pass), the injection, and in backward the gradient of the
    output. No weight is copied: the graphs read them where they live."""
    with emulated():
        model = graph_model(make_model, arch, ("cpu", torch.float64), mode)
        data = batches("cpu", 2)
        train(model, "on", data, steps=1)  # capture
        counter = CopyCounter()
        with counter:
            loss = model(data[0], labels=data[0])
            loss.backward()
    d, width = model.config.d_model, model.core.injection.proj.out_features
    iterate, inj = (2, 16, d), (2, 16, width)
    weights = {tuple(p.shape) for p in model.core.backbone.parameters()}
    assert not [shape for shape in counter.shapes if shape in weights], counter.shapes
    assert counter.shapes.count(iterate) == model.core.settings.max_iter + 2  # each pass; the phantom
    assert counter.shapes.count(inj) == 2  # graph's input and the gradient of its output; solver and phantom


def test_llama_at_a_second_length_then_the_first_again(make_model):
    """A longer forward makes a new RoPE table; graphs captured at the first length read the old
    one by address, so they are captured again."""
    with emulated():
        model = graph_model(make_model, "llama", ("cpu", torch.float64))
        eager_model = graph_model(make_model, "llama", ("cpu", torch.float64))
        eager_model.load_state_dict(model.state_dict())
        eager_model.core.cuda_graphs = "off"
        model.core.cuda_graphs = "on"
        for length in (16, 16, 32, 32, 16, 16):
            ids = batches("cpu", 1, length)[0]
            loss, expected = model(ids, labels=ids), eager_model(ids, labels=ids)
            assert abs(loss.item() - expected.item()) <= 1e-10 * abs(expected.item()), length
        assert any(key[0] == "grad" and key[1][0] == (2, 16, model.config.d_model) for key in model.core.graphs.cache)


def test_a_backward_the_graph_cannot_replay_is_refused(make_model):
    with emulated():
        model = graph_model(make_model, "mamba2", ("cpu", torch.float64))
        model.core.cuda_graphs = "on"
        ids = batches("cpu", 1)[0]
        model(ids, labels=ids).backward()  # eager (first sight of the shape)
        first = model(ids, labels=ids)  # captured and replayed
        second = model(ids, labels=ids)  # replayed into the same buffers
        with pytest.raises(RuntimeError, match="after a later forward replayed the same graph"):
            first.backward()
        second.backward()
        loss = model(ids, labels=ids)  # a parameter moves between this forward and its backward
        out_proj = model.core.backbone.layers[0].mixer.out_proj.parametrizations.weight.original1
        out_proj.data = out_proj.data.clone()
        with pytest.raises(RuntimeError, match=r"parameter .*out_proj.* moved to other memory"):
            loss.backward()


@pytest.mark.parametrize(("device", "dtype"), [("cpu", torch.float64), ("cuda", torch.float32),
                                             ("cuda", torch.bfloat16)])
def test_chunked_loss_equals_float32_logits(device, dtype):
    """On the GPU in its dtypes, and on the CPU in float64 (every commit: the same assertions)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU")
    z = torch.randn(4, 700, 64, device=device, dtype=dtype, requires_grad=True)
    weight = (0.1 * torch.randn(5000, 64, device=device, dtype=dtype)).requires_grad_()
    labels = torch.randint(0, 5000, (4, 700), device=device)
    logits_dtype = torch.promote_types(dtype, torch.float32)  # float32 logits, or float64 ones in float64
    ref = torch.nn.functional.cross_entropy((z @ weight.t()).to(logits_dtype).flatten(0, 1), labels.flatten())
    ref_z, ref_w = torch.autograd.grad(ref, (z, weight))
    loss = linear_cross_entropy(z, weight, labels, chunk_tokens=1000)
    got_z, got_w = torch.autograd.grad(loss, (z, weight))
    assert abs(loss.item() - ref.item()) <= (1e-12 if dtype == torch.float64 else 1e-5) * ref.item()
    assert close(got_z.double(), ref_z.double(), dtype) and close(got_w.double(), ref_w.double(), dtype)


def test_a_gradient_kept_by_a_hook_is_not_overwritten_by_the_next_micro_batch(make_model):
    """A hook that holds a parameter's gradient past its backward (DeepSpeed's gradient buckets do,
    until they are reduced): the graphed backward's buffers are overwritten by the next replay, so
    what it hands to autograd must be copies, or the first micro-batch's kept gradient would turn
    into the second's."""
    with emulated():
        models = {graphs: graph_model(make_model, "mamba2", ("cpu", torch.float64)) for graphs in ("off", "on")}
        models["on"].load_state_dict(models["off"].state_dict())
        kept = {}
        for graphs, model in models.items():
            model.core.cuda_graphs = graphs
            weight = model.core.backbone.layers[0].mixer.out_proj.parametrizations.weight.original1
            kept[graphs] = []
            weight.register_hook(lambda g, kept=kept[graphs]: kept.append(g))
            for ids in batches("cpu", 2) * 2:  # the second pass over the batches replays the graphs
                model(ids, labels=ids).backward()
        assert len(kept["on"]) == len(kept["off"]) == 4
        for got, want in zip(kept["on"], kept["off"], strict=True):
            assert close(got, want, torch.float64)
