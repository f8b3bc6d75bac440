"""One registry shape for every named choice (algorithms, models, generators, converters,
partitions, schedules, trainers, selections): a name -> object table whose built-ins are
written as ``"module:attr"`` and imported on first use, so that listing the names (``--help``,
config checks) costs no import of torch or of the algorithms.

A name is looked up, in order: among the registered names (the built-ins and ``register``);
for registries open to plugins (``group`` set), as ``"package.module:Name"`` (any importable
module: a file in the working directory or on PYTHONPATH) and among the entry points of the
group (``fedsim.algorithms``, ``fedsim.models``, ``fedsim.generators``, ``fedsim.converters``)
of the installed packages. Every failure is one FedsimError line naming what was looked up,
where, and how to fix it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, MutableMapping
from importlib.metadata import entry_points
from typing import Any, Callable, Iterator

from fedsim.errors import FedsimError, choice_error, first_line


class Registry(MutableMapping):
    """name -> object for one kind of choice; `accepts` says whether an object is that kind.

    Values given as ``"module:attr"`` strings are imported when first read; so is `accepts`
    given that way (the check of a kind lives with the kind, which may itself use the registry).
    """

    def __init__(self, what: str, accepts: Callable[[Any], bool] | str, built_ins: dict[str, Any],
                 group: str | None = None):
        self.what, self._accepts, self.group = what, accepts, group
        self._entries: dict[str, Any] = dict(built_ins)

    def accepts(self, obj: Any) -> bool:
        if isinstance(self._accepts, str):
            self._accepts = self._load(self._accepts, self.what, f"the check {self._accepts!r}")
        return self._accepts(obj)

    # -- the mapping: built-ins and registered names ------------------------------------------
    def __getitem__(self, name: str) -> Any:
        value = self._entries[name]
        if isinstance(value, str):
            value = self._entries[name] = self._load(value, name, f"built-in {name!r}")
        return value

    def __setitem__(self, name: str, obj: Any) -> None:
        self._entries[name] = obj

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def register(self, name: str, obj: Any) -> Any:
        self[name] = obj
        return obj

    # -- plugins ------------------------------------------------------------------------------
    def _plugins(self) -> list:
        return list(entry_points(group=self.group)) if self.group else []

    def names(self) -> list[str]:
        """The built-in and registered names in their order, then the installed entry points'
        names, sorted; imports nothing."""
        plugins = {ep.name for ep in self._plugins()} - set(self._entries)
        return [*self._entries, *sorted(plugins)]

    def check_name(self, name: str, where: str) -> None:
        """FedsimError for a name that is neither registered nor installed nor a plugin's
        'module:Name' (whose import `lookup` checks); imports nothing."""
        if name not in self._entries and not (self.group and ":" in name) and name not in self.names():
            raise choice_error(where, name, self.names())

    def lookup(self, name: str, where: str) -> Any:
        """The object registered, importable or installed under `name` (FedsimError if none)."""
        if name in self._entries:
            return self[name]
        if not self.group:
            raise choice_error(where, name, self.names(), "is not valid")
        if ":" in name:
            obj = self._from_module(name, where)
        else:
            found = [ep for ep in self._plugins() if ep.name == name]
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

    @staticmethod
    def _load(target: str, where: str, what: str) -> Any:
        """Import "module:attr" (an entry point's value has the same form; attr may be dotted,
        and a part may be a key of a mapping)."""
        module_name, _, attr = target.partition(":")
        if not module_name or not attr:
            raise FedsimError(f"{where}: {what} is not of the form 'package.module:Name'")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
                dotted = module_name.removesuffix(".py").replace("\\", "/").strip("/").replace("/", ".")
                raise FedsimError(f"{where}: {what} names a file, not a module; name the module: "
                                  f"'{dotted}:{attr}' (looked up in the working directory and on PYTHONPATH)") from None
            if err.name and module_name.startswith(err.name):
                raise FedsimError(f"{where}: {what}: no module {module_name!r} in the working "
                                  "directory or on PYTHONPATH; check the name or add its folder "
                                  "to PYTHONPATH") from None
            raise FedsimError(f"{where}: {what}: importing {module_name!r} failed: {err}") from None
        except Exception as err:  # the plugin's own code broke while importing
            raise FedsimError(f"{where}: {what}: importing {module_name!r} failed "
                              f"({type(err).__name__}: {first_line(err)}); fix the module") from None
        except SystemExit as exit:  # it would end fedsim without a word
            raise FedsimError(f"{where}: {what}: importing {module_name!r} called sys.exit({exit.code!r}); "
                              "a module fedsim imports must not exit: raise an exception instead") from None
        obj = module
        for part in attr.split("."):
            if isinstance(obj, Mapping) and part in obj:
                obj = obj[part]
            elif hasattr(obj, part):
                obj = getattr(obj, part)
            else:
                raise FedsimError(f"{where}: {what}: module {module_name!r} has no {attr!r}")
        return obj
