"""Evaluation and generation of trained models, as in the paper's evaluation section.

One job per module:

    loading.py      a model, its config and tokenizer from a checkpoint folder or an export
    phases.py       the (s+k) solver settings the weights were trained with, and overrides
    windows.py      non-overlapping windows of the test split at one length
    perplexity.py   token NLL in simultaneous mode; perplexity and per-position buckets
    sequential.py   the same windows token by token (sequential mode), with per-token solver passes
    duality.py      greedy match rate and perplexity difference between the two modes
    dynamics.py     solver passes and final relative residual (Table 7 of the paper)
    generation.py   sampling and sequential-mode generation with constant memory in the passes
    lm_adapter.py   the model registered in lm-evaluation-harness as "implicit_megatron"
    lm_eval_run.py  running harness tasks through that adapter or transformers' "hf" model
    lm_eval_options.py what a harness run is asked for: tasks, where they come from, the backend
    lm_eval_data.py whether the tasks can get their data here, said in one line before a model loads
    report.py       markdown tables in the paper's layout
    plots.py        PNG figures (per-position perplexity, passes per token, duality)
    tracking.py     MLflow logging into a run's store
    runner.py       the tasks of tools/evaluate.py, their caches and output files
"""
