"""Our config and model registered with transformers' Auto classes when the package is imported.

transformers loads a folder whose config.json has an `auto_map` by running the folder's own
modeling file, and only with `trust_remote_code=True`: for a folder you received, that runs
whatever the file holds. Registered, `model_type: implicit_megatron` names the installed package's
classes instead, so that after `import implicit_megatron`

    AutoConfig / AutoTokenizer / AutoModelForCausalLM.from_pretrained(folder)

load an export without the flag and run no file of the folder (transformers then prefers a
registered class even where the flag is passed).

Importing transformers' model classes takes seconds, and most processes of the package (training
ranks, tools) never touch transformers, so `install` only arranges the registration: the config
is registered the moment transformers' AutoConfig module is imported (at once if it already is;
the config's module imports nothing heavier than that module did), and the model when the first
ImplicitMegatronConfig is made (inside from_pretrained, never in the middle of an import).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

CONFIG_AUTO = "transformers.models.auto.configuration_auto"  # where AutoConfig's mapping lives


def register_config(configuration_auto) -> None:
    from implicit_megatron.hf.config import FIRST_USE, ImplicitMegatronConfig

    configuration_auto.CONFIG_MAPPING.register(ImplicitMegatronConfig.model_type, ImplicitMegatronConfig,
                                               exist_ok=True)
    FIRST_USE.append(register_model)


def register_model() -> None:
    """AutoModelForCausalLM builds ImplicitMegatronForCausalLM for our config."""
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    from implicit_megatron.hf.config import ImplicitMegatronConfig
    from implicit_megatron.hf.model import ImplicitMegatronForCausalLM

    AutoModelForCausalLM.register(ImplicitMegatronConfig, ImplicitMegatronForCausalLM, exist_ok=True)


class RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds transformers' AutoConfig module with the other finders, and registers our config right
    after the module has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != CONFIG_AUTO:
            return None
        sys.meta_path.remove(self)  # the real spec, from the finders after this one; needed once only
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def run_and_register(module) -> None:
            run(module)
            register_config(module)

        spec.loader.exec_module = run_and_register
        return spec


def install() -> None:
    if CONFIG_AUTO in sys.modules:
        register_config(sys.modules[CONFIG_AUTO])
    elif not any(isinstance(finder, RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, RegisterOnImport())
