"""One registry shape for what users plug in (algorithms and models; generators and converters
are to follow): a name -> object table that also finds plugins outside fedsim.

A name is looked up, in order: among the registered names (the built-ins and `@register`);
as ``"package.module:Name"`` (any importable module: a file in the working directory or on
PYTHONPATH); among the entry points of the registry's group (``fedsim.algorithms`` for
algorithms, ``fedsim.models`` for models) of the installed packages. Every failure is one FedsimError line naming what was
looked up, where, and how to fix it.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import entry_points
from typing import Any, Callable

from fedsim.errors import FedsimError, choice_error


class Registry(dict):
    """name -> object for one kind of plugin; `accepts` says whether an object is that kind."""

    def __init__(self, group: str, accepts: Callable[[Any], bool], what: str):
        super().__init__()
        self.group, self.accepts, self.what = group, accepts, what

    def register(self, name: str, obj: Any) -> Any:
        self[name] = obj
        return obj

    def names(self) -> list[str]:
        """Registered names and the installed entry points' names, sorted."""
        return sorted({*self, *(ep.name for ep in entry_points(group=self.group))})

    def lookup(self, name: str, where: str) -> Any:
        """The object registered, importable or installed under `name` (FedsimError if none)."""
        if name in self:
            return self[name]
        if ":" in name:
            obj = self._from_module(name, where)
        else:
            found = [ep for ep in entry_points(group=self.group) if ep.name == name]
            if not found:
                raise choice_error(where, name, self.names())
            obj = self._load(found[0].value, where, f"entry point {name!r} of {self.group}")
        if not self.accepts(obj):
            raise FedsimError(f"{where} = {name!r} is {obj!r}, which is not {self.what}")
        return obj

    def _from_module(self, name: str, where: str) -> Any:
        if os.getcwd() not in sys.path:  # `fedsim` run as a script does not look there itself
            sys.path.append(os.getcwd())
        return self._load(name, where, f"{name!r}")

    def _load(self, target: str, where: str, what: str) -> Any:
        """Import "module:attr" (an entry point's value has the same form)."""
        module_name, _, attr = target.partition(":")
        if not module_name or not attr:
            raise FedsimError(f"{where}: {what} is not of the form 'package.module:Name'")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                raise FedsimError(f"{where}: {what}: no module {module_name!r} in the working "
                                  "directory or on PYTHONPATH; check the name or add its folder "
                                  "to PYTHONPATH") from None
            raise FedsimError(f"{where}: {what}: importing {module_name!r} failed: {err}") from None
        except Exception as err:  # the plugin's own code broke while importing
            raise FedsimError(f"{where}: {what}: importing {module_name!r} failed "
                              f"({type(err).__name__}: {err}); fix the module") from None
        obj = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise FedsimError(f"{where}: {what}: module {module_name!r} has no {attr!r}")
            obj = getattr(obj, part)
        return obj
