"""Every pass of every mode of the method runs inside the one iteration routine (implicit.iteration):
training's solve, both evaluation rules at each scope, the passes replayed from (emulated) CUDA
graphs, the unrolled gradient and sequential mode's token solve. Only the phantom steps, which
are not a solve, run outside it."""

from __future__ import annotations

import inspect

import pytest
import torch
from support.cuda_graph_emulation import emulated

from implicit_megatron.implicit import SolverSettings

ALLOWED = {"iterate", "phantom_steps", "verify", "_warm_up", "__init__"}  # graphs check and capture their passes


def callers_of_passes(model, run) -> set[str]:
    """The function that called the backbone for each pass of `run()`, other than the core's own:
    `iterate` for a solve, `phantom_steps` for the steps with gradient."""
    seen: set[str] = set()
    backbone = model.core.backbone

    def note(*_):
        names = [frame.function for frame in inspect.stack()[2:12]]
        seen.add(next((n for n in names if n in ALLOWED), "/".join(names[:6])))

    handles = [backbone.register_forward_pre_hook(note)]
    plain_step = backbone.step

    def step(*args, **kwargs):
        note()
        return plain_step(*args, **kwargs)

    backbone.step = step
    try:
        run()
    finally:
        del backbone.step
        for h in handles:
            h.remove()
    return seen


MODES = {
    "train (4+2)": (True, SolverSettings(max_iter=4, phantom_steps=2)),
    "train free": (True, SolverSettings(max_iter=30, tol=1e-3, phantom_steps=2)),
    "unrolled": (True, SolverSettings(max_iter=3, gradient="unrolled_damped")),
    **{f"eval {rule} {stop}": (False, SolverSettings(max_iter=6, tol=1e-3, eval_rule=rule, eval_stop=stop))
       for rule in ("released", "solver") for stop in ("token", "sequence", "batch")},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_forward_iterates_only_through_the_one_routine(mode, make_model):
    training, settings = MODES[mode]
    model = make_model("mamba2", contractive=True).train(training)
    model.core.settings = settings
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.set_grad_enabled(training):
        seen = callers_of_passes(model, lambda: model(ids))
    assert seen <= {"iterate", "phantom_steps"} and "iterate" in seen


def test_replayed_graphs_iterate_through_the_one_routine(make_model):
    model = make_model("llama", contractive=True).train()
    model.core.settings = SolverSettings(max_iter=20, tol=1e-3, phantom_steps=2)
    x = model.embedding(torch.randint(0, 101, (2, 7))).detach()
    with emulated():
        model.core.cuda_graphs = "on"
        for _ in range(2):  # the first forward of a shape runs eagerly, the second captures
            model.core(x)
        solves = []
        plain = model.core.graphs.cache[next(k for k in model.core.graphs.cache if k[0] == "solve")].step

        def counted(z, need_residual):
            solves.append(next((f.function for f in inspect.stack()[1:4] if f.function == "iterate"), "elsewhere"))
            return plain(z, need_residual)

        model.core.graphs.cache[next(k for k in model.core.graphs.cache if k[0] == "solve")].step = counted
        model.core(x)
    assert solves and set(solves) == {"iterate"}


@pytest.mark.parametrize("rule", ["released", "solver"])
@pytest.mark.parametrize("stop", ["row", "batch"])
def test_sequential_mode_iterates_each_token_through_the_one_routine(rule, stop, make_model):
    model = make_model("llama", contractive=True).eval()
    model.core.settings = SolverSettings(max_iter=6, tol=1e-3, eval_rule=rule, sequential_stop=stop)
    x = model.embedding(torch.randint(0, 101, (2, 5))).detach()
    assert callers_of_passes(model, lambda: model.core.forward_sequential(x)) == {"iterate"}
