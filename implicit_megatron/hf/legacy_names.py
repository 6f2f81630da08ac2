"""Old module names kept answering, for folders exported by earlier versions of this package.

Until the package was split into subpackages, an export carried a whole copy of the transformers wrapper
as `modeling_implicit_megatron.py`, and that copy imports `implicit_megatron.export` and
`implicit_megatron.hf_cache`. Those modules now live in `hf/`; `OLD_MODULES` answers their old
names with the names such a copy uses, so that such a folder still loads where transformers runs
its copy (the flag trust_remote_code, without the package imported: imported, the package's
registered classes load it, hf/auto.py). Exports made since carry `remote_code.py`, which needs no
old name. Installed by the package's `__init__`; nothing is imported until an old name is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

OLD_MODULES = {  # old module -> {name it offered: the module that holds it now}
    "implicit_megatron.export": {"config_from_dict": "implicit_megatron.config.saved"},
    "implicit_megatron.hf_cache": {"SequentialState": "implicit_megatron.hf.generation_state",
                                   "refuse_padding": "implicit_megatron.hf.generation_state"},
}


class OldModuleNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name (after the normal finders, which no longer do) and fills it."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in OLD_MODULES else None

    def create_module(self, spec):
        return None  # a plain module

    def exec_module(self, module) -> None:
        for name, home in OLD_MODULES[module.__name__].items():
            setattr(module, name, getattr(importlib.import_module(home), name))


def install() -> None:
    if not any(isinstance(finder, OldModuleNames) for finder in sys.meta_path):
        sys.meta_path.append(OldModuleNames())
