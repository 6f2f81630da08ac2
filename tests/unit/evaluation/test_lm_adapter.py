"""lm-evaluation-harness offline: local task files through our adapter and through transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.processes import ROOT

from implicit_megatron.evaluation.lm_eval_options import LmEvalOptions
from implicit_megatron.evaluation.lm_eval_run import run_lm_eval

TASKS = Path(__file__).parent / "fixtures" / "lm_eval"


@pytest.fixture(autouse=True)
def at_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the task files name their jsonl relative to the repository


class Request:
    def __init__(self, *args):
        self.args = args


@pytest.mark.processes  # lm_eval's logger asks git for the commit
def test_local_tasks_of_every_output_type_run_offline(loaded):
    options = LmEvalOptions(tasks=["tiny_lambada", "tiny_piqa", "tiny_rolling", "tiny_gen"], include_path=str(TASKS),
                            batch_size=4)
    out = run_lm_eval(loaded, options)
    tasks = out["tasks"]
    assert set(tasks) == {"tiny_lambada", "tiny_piqa", "tiny_rolling", "tiny_gen"}
    assert tasks["tiny_lambada"]["perplexity"] > 1 and 0 <= tasks["tiny_lambada"]["acc"] <= 1
    assert 0 <= tasks["tiny_piqa"]["acc"] <= 1 and 0 <= tasks["tiny_piqa"]["acc_norm"] <= 1
    assert tasks["tiny_rolling"]["word_perplexity"] > 1
    assert 0 <= tasks["tiny_gen"]["exact_match"] <= 1
    assert out["n_samples"]["tiny_piqa"] == 3


def test_loglikelihood_is_the_sum_of_the_continuation_log_probabilities(loaded):
    from implicit_megatron.evaluation.lm_adapter import ImplicitMegatronLM

    lm = ImplicitMegatronLM(loaded=loaded, batch_size=2)
    requests = [Request("ROMEO: But, soft!", " what light"), Request("HAMLET: To be, or not", " to be"),
                Request("JULIET:", " O Romeo")]
    scores = lm.loglikelihood(requests)
    sequential = ImplicitMegatronLM(loaded=loaded, batch_size=2, mode="sequential").loglikelihood(requests)
    tok, model = loaded.tokenizer, loaded.model
    for (context, continuation), (score, _), (seq_score, _) in zip((r.args for r in requests), scores, sequential):
        ctx, whole = tok.encode(context), tok.encode(context + continuation)
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([whole[:-1]]))[0, :, :model.vocab_size], dim=-1)
        expected = sum(logprobs[i - 1, whole[i]].item() for i in range(len(ctx), len(whole)))
        assert score == pytest.approx(expected, abs=1e-3)
        assert seq_score == pytest.approx(expected, abs=1e-2)
    rolling = lm.loglikelihood_rolling([Request("ROMEO: But, soft! what light")])[0]
    ids = tok.encode("ROMEO: But, soft! what light")
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([[tok.eod_id] + ids[:-1]]))[0, :, :model.vocab_size], -1)
    assert rolling == pytest.approx(logprobs.gather(-1, torch.tensor(ids)[:, None]).sum().item(), abs=1e-3)


def test_generate_until_stops_at_the_stop_string(loaded):
    from implicit_megatron.evaluation.lm_adapter import ImplicitMegatronLM

    lm = ImplicitMegatronLM(loaded=loaded)
    (free,) = lm.generate_until([Request("ROMEO:", {"until": ["\u0000never"], "max_gen_toks": 6})])
    stop = free.strip()[:1] or free[:1]
    (cut,) = lm.generate_until([Request("ROMEO:", {"until": [stop], "max_gen_toks": 6})])
    assert free.startswith(cut) and stop not in cut


@pytest.mark.processes  # lm_eval's logger asks git for the commit
def test_the_transformers_export_runs_as_lm_evals_hf_model(tiny_run):
    pytest.importorskip("accelerate", reason="lm-eval's hf model needs accelerate (the eval extra)")
    from implicit_megatron.evaluation.loading import load_model
    from implicit_megatron.evaluation.phases import SolverChoice

    export = load_model(tiny_run.export, choice=SolverChoice(tol=1e-4, max_iter=200))
    options = LmEvalOptions(tasks=["tiny_piqa"], include_path=str(TASKS), backend="hf", batch_size=4)
    ours = run_lm_eval(export, LmEvalOptions(tasks=["tiny_piqa"], include_path=str(TASKS), batch_size=4))
    assert run_lm_eval(export, options)["tasks"]["tiny_piqa"]["acc"] == ours["tasks"]["tiny_piqa"]["acc"]
    with pytest.raises(ValueError, match="the hf backend needs an exported folder"):
        run_lm_eval(load_model(tiny_run.checkpoints), options)


def test_the_model_is_registered_by_name(tiny_run):
    from lm_eval.api.registry import get_model

    from implicit_megatron.evaluation.lm_adapter import ImplicitMegatronLM

    cls = get_model("implicit_megatron")
    assert cls is ImplicitMegatronLM
    lm = cls.create_from_arg_string(f"pretrained={tiny_run.checkpoints},max_iter=50,tol=0.001,mode=sequential",
                                    {"batch_size": 4, "device": "cpu"})
    assert lm.loaded.solver["cap"] == 50 and lm.mode == "sequential" and lm.batch_size == 4


@pytest.mark.parametrize("mode", ["simultaneous", "sequential"])
def test_batches_of_three_score_and_generate_as_each_request_alone(loaded, mode):
    """loglikelihood (right-padded) and generate_until (left-padded, sequential mode) with batch size 3
    on requests of different lengths give what each request gives alone."""
    from implicit_megatron.evaluation.lm_adapter import ImplicitMegatronLM

    batched, alone = (ImplicitMegatronLM(loaded=loaded, batch_size=size, mode=mode) for size in (3, 1))
    scoring = [Request("ROMEO: But, soft!", " what light"), Request("HAMLET: To be, or not to be, that", " is"),
               Request("JULIET:", " O Romeo, Romeo")]
    for (score, greedy), (alone_score, alone_greedy) in zip(batched.loglikelihood(scoring),
                                                            alone.loglikelihood(scoring), strict=True):
        assert score == pytest.approx(alone_score, abs=1e-4) and greedy == alone_greedy
    settings = {"until": ["\u0000never"], "max_gen_toks": 5}
    generation = [Request("ROMEO:", settings), Request("HAMLET: To be, or not to be,", settings),
                  Request("JULIET: O", settings)]
    assert batched.generate_until(generation) == alone.generate_until(generation)


@pytest.mark.processes  # lm_eval's logger asks git for the commit
def test_local_tasks_in_sequential_mode_give_the_same_scores_at_batch_size_3_and_1(loaded):
    options = {"tasks": ["tiny_lambada", "tiny_gen"], "include_path": str(TASKS), "mode": "sequential"}
    three = run_lm_eval(loaded, LmEvalOptions(**options, batch_size=3))["tasks"]
    one = run_lm_eval(loaded, LmEvalOptions(**options, batch_size=1))["tasks"]
    assert three["tiny_gen"] == one["tiny_gen"]
    assert three["tiny_lambada"]["acc"] == one["tiny_lambada"]["acc"]
    assert three["tiny_lambada"]["perplexity"] == pytest.approx(one["tiny_lambada"]["perplexity"], rel=1e-4)
