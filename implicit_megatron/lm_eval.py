"""lm-eval's own command line, with this package imported first:

    python -m implicit_megatron.lm_eval --model hf --model_args pretrained=EXPORT --tasks ... [lm_eval's options]

The import registers the exported model with transformers' Auto classes, so lm-eval's `hf` model
loads a folder without `trust_remote_code` (none of the folder's code runs), and registers the
package's own lm-eval model (`--model implicit_megatron --model_args pretrained=CHECKPOINT_OR_EXPORT`,
padding masked, sequential mode available). Every other option is lm-eval's, unchanged.
"""

from __future__ import annotations

import sys

from implicit_megatron.utils.extras import missing


def main() -> None:
    problem = missing("lm_eval", "python -m implicit_megatron.lm_eval") or missing("transformers", "lm-eval's hf model")
    if problem is not None:
        print(f"lm_eval: error: {problem}", file=sys.stderr)
        sys.exit(2)
    from lm_eval.__main__ import cli_evaluate

    import implicit_megatron  # noqa: F401 - registers the config and model with transformers' Auto classes
    import implicit_megatron.evaluation.lm_adapter  # noqa: F401 - registers --model implicit_megatron

    cli_evaluate()


if __name__ == "__main__":
    main()
