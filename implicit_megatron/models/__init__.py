"""The backbones in PyTorch, with fused kernels when present: one folder each (mamba2/, llama/) with a
spec of what the rest of the package knows of it (spec.py, registry.py), on shared parts: the stack
F (backbone.py), norms, kernels, packed documents and padding, the language model and its loss.

`implicit_megatron.build_model(cfg)` composes a Backbone with its core and the LanguageModel head.
Nothing is imported here: the config check reads the specs without torch.
"""
