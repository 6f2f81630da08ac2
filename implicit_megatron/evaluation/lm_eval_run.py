"""lm-evaluation-harness tasks through our adapter or through transformers' "hf" model.

The paper's seven tasks need their data sets from the Hub, or from the local cache where the Hub
cannot be reached (lm_eval_data.py says in one line which are missing). Offline, `include_path`
names a folder of local task YAMLs (with jsonl data); then only those tasks are loaded, which also
keeps start-up fast. The "hf" backend runs an exported folder through AutoModelForCausalLM (the
package's registered class: no code of the folder runs), set to the same solver phase as our adapter.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

from implicit_megatron.evaluation.lm_eval_data import check_tasks
from implicit_megatron.evaluation.lm_eval_options import LmEvalOptions
from implicit_megatron.evaluation.loading import LoadedModel
from implicit_megatron.evaluation.phases import apply_solver


def build_lm(loaded: LoadedModel, options: LmEvalOptions):
    """The harness model object for the chosen backend."""
    if options.backend == "implicit_megatron":
        from implicit_megatron.evaluation.lm_adapter import ImplicitMegatronLM

        return ImplicitMegatronLM(loaded=loaded, batch_size=options.batch_size, max_length=options.max_length,
                                  mode=options.mode)
    if options.backend == "hf":
        return hf_lm(loaded, options)
    raise ValueError(f"unknown lm-eval backend {options.backend!r} (implicit_megatron or hf)")


def hf_lm(loaded: LoadedModel, options: LmEvalOptions):
    """lm_eval's HFLM on the exported folder loaded by transformers' AutoModelForCausalLM."""
    if loaded.kind != "export":
        raise ValueError(f"{loaded.source}: the hf backend needs an exported folder; write one with "
                         "tools/convert_checkpoint.py export")
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from implicit_megatron.hf.export import TOKENIZER_FILES

    if not any((Path(loaded.source) / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{loaded.source}: the hf backend reads the export's own tokenizer, and it has none "
                         f"({' or '.join(TOKENIZER_FILES)}); export again where data.tokenizer is at hand")
    model = AutoModelForCausalLM.from_pretrained(loaded.source).eval()
    model.to(loaded.model.embedding.weight.device)
    apply_solver(model._language_model[0], loaded.solver)
    tokenizer = AutoTokenizer.from_pretrained(loaded.source)  # what a transformers user of the folder gets
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=options.batch_size,
                max_length=options.max_length or loaded.cfg.data.seq_len, device=str(model.device))


def run_lm_eval(loaded: LoadedModel, options: LmEvalOptions) -> dict:
    """{"backend", "tasks": {task: {metric: value}}, "n_samples": {task: count}}."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    manager = check_tasks(options)  # sets the download mode before lm_eval imports datasets
    from lm_eval import simple_evaluate

    out = simple_evaluate(model=build_lm(loaded, options), tasks=list(options.tasks), task_manager=manager,
                          limit=options.limit, num_fewshot=options.num_fewshot, log_samples=False,
                          bootstrap_iters=0, batch_size=options.batch_size)
    tasks = {}
    for task, metrics in out["results"].items():
        tasks[task] = {k.split(",")[0]: float(v) for k, v in metrics.items()
                       if isinstance(v, (int, float)) and "_stderr" not in k}
    return {"backend": options.backend, "mode": options.mode, "tasks": tasks,
            "n_samples": {t: int(cast(int, n.get("effective", n.get("original", 0)))) if isinstance(n, dict) else int(n)
                          for t, n in out.get("n-samples", {}).items()}}
