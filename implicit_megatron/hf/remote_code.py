"""The `modeling_implicit_megatron.py` that every exported folder carries (trust_remote_code).

It names the installed package's classes instead of holding a copy of them, so that a folder keeps
loading as the package changes: transformers' Auto classes get exactly the model that
`implicit_megatron.from_pretrained` builds. The package must be installed where the folder is loaded;
once it is imported, transformers uses its registered classes and never this file (hf/auto.py).
"""

from implicit_megatron.hf.config import ImplicitMegatronConfig
from implicit_megatron.hf.model import ImplicitMegatronForCausalLM

__all__ = ["ImplicitMegatronConfig", "ImplicitMegatronForCausalLM"]
