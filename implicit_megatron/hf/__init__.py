"""Our models among transformers' and the paper's: exported folders, and weights in from elsewhere.

    export.py            model folders: written from a checkpoint (`export`), read (`from_pretrained`)
    export_reader.py     an exported folder read: config.json through the config's rules, the weights' header
    config.py            the transformers config of an export (our run config inside)
    model.py             the transformers model behind AutoModelForCausalLM
    auto.py              both registered with transformers' Auto classes when the package is imported
    remote_code.py       the code every exported folder carries: the package's model modules, standalone
    generation_state.py  the sequential-mode state that `generate` carries between tokens
    import_explicit.py   weights in from explicit transformers / mamba_ssm Mamba2 and Llama models
    released.py          the paper's released checkpoints (implicit_llm) in and out
    legacy_names.py      the module names that folders exported by earlier versions import
"""
