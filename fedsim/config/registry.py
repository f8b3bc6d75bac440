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

import functools
import importlib
import os
import sys
from collections.abc import Mapping, MutableMapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Iterator

from fedsim.errors import FedsimError, choice_error, did_you_mean, first_line

# top-level module -> the folder it was imported from, where that folder was the working
# directory (a plugin file beside the config): a run records those its config names
# (manifest.json's `plugin_folders`), and its resume puts them on the import path, so that the
# resume command fedsim prints works from any directory
FROM_WORKING_DIRECTORY: dict[str, str] = {}
_RECORDED: set[str] = set()  # folders that `use_plugin_folders` put on the import path


class Registry(MutableMapping):
    """name -> object for one kind of choice; `accepts` says whether an object is that kind.

    Values given as ``"module:attr"`` strings are imported when first read; so is `accepts`
    given that way (the check of a kind lives with the kind, which may itself use the registry).
    """

    def __init__(self, what: str, accepts: Callable[[Any], bool] | str, built_ins: dict[str, Any],
                 group: str | None = None, known_as: dict[str, str] | None = None):
        """`known_as`: names people call a built-in setting by, with how to set it here ("fedadam":
        fedavg with server_optimizer = 'adam'), which "did you mean" (close spellings) would not find."""
        self.what, self._accepts, self.group = what, accepts, group
        self._entries: dict[str, Any] = dict(built_ins)
        self.known_as = known_as or {}

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
        return list(_installed(self.group, _import_path_state())) if self.group else []

    def names(self) -> list[str]:
        """The built-in and registered names in their order, then the installed entry points'
        names, sorted; imports nothing."""
        plugins = {ep.name for ep in self._plugins()} - set(self._entries)
        return [*self._entries, *sorted(plugins)]

    def check_name(self, name: str, where: str) -> None:
        """FedsimError for a name that is neither registered nor installed nor a plugin's
        'module:Name' (whose import `lookup` checks); imports nothing."""
        if name not in self._entries and not (self.group and ":" in name) and name not in self.names():
            module, _, attribute = name.rpartition(".")
            if self.group and module and attribute and not did_you_mean(name, self.names()):  # `my_nets.make`
                raise FedsimError(f"{where} = {name!r} is unknown; a plugin is named 'module:attribute': did you mean "
                                  f"'{module}:{attribute}'? (built-in: {', '.join(self.names())})")
            raise self.unknown(name, where)

    def unknown(self, name: str, where: str) -> FedsimError:
        """The error for a name that nothing here goes by: what it is called here, if people call
        a setting by it, else the closest name."""
        if name.lower() in self.known_as:
            return FedsimError(f"{where} = {name!r} is unknown by that name: it is {self.known_as[name.lower()]} "
                               f"(one of: {', '.join(self.names())})")
        return choice_error(where, name, self.names())

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
                raise self.unknown(name, where)
            obj = self._load(found[0].value, where, f"entry point {name!r} of {self.group}")
        if not self.accepts(obj):
            raise FedsimError(f"{where} = {name!r} is {obj!r}, which is not {self.what}")
        return obj

    def _from_module(self, name: str, where: str) -> Any:
        cwd = os.getcwd()
        if cwd not in sys.path:  # `fedsim` run as a script does not look there itself
            sys.path.append(cwd)
        obj = self._load(name, where, f"{name!r}")
        top = name.partition(":")[0].split(".")[0]
        root = _import_root(sys.modules.get(top))
        if root is not None and (root == Path(cwd).resolve() or str(root) in _RECORDED):
            FROM_WORKING_DIRECTORY[top] = str(root)  # (a resumed run records it again)
        return obj

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
                if module_name == "__main__":  # defined in a script or notebook that is not running now
                    raise FedsimError(f"{where}: {what}: the script or notebook that defined it (__main__) is not "
                                      f"what runs now; move {attr!r} into a module file (my_models.py: "
                                      f"'my_models:{attr}') to use it from the command line and to resume its "
                                      "runs, or resume with fedsim.resume() from that script")
                names = list(obj) if isinstance(obj, Mapping) else [n for n in dir(obj) if not n.startswith("_")]
                hint = did_you_mean(part, names)
                raise FedsimError(f"{where}: {what}: module {module_name!r} has no {attr!r}"
                                  f"{'; ' + hint if hint else ''}")
        return obj


@functools.lru_cache(maxsize=16)
def _installed(group: str, path_state: tuple) -> tuple:
    """The entry points of `group`, read once per state of the import path: reading them scans
    every installed distribution's metadata (~6 ms a call), and a study's configs ask for
    every registry's names."""
    return tuple(entry_points(group=group))


def _import_path_state() -> tuple:
    """The import path and when each of its folders last changed (a package installed into one,
    or a folder added to the path, is a new state)."""
    state = []
    for folder in sys.path:
        try:
            state.append((folder, os.stat(folder or ".").st_mtime_ns))
        except OSError:
            state.append((folder, None))
    return tuple(state)


def _import_root(module) -> Path | None:
    """The folder on the import path that holds the top-level `module` (None: it has no file)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    return path.parent.parent if hasattr(module, "__path__") else path.parent


def plugin_folders(values: Any) -> list[str]:
    """The working-directory folders (`FROM_WORKING_DIRECTORY`) of the plugin modules that
    `values` (a config as nested dicts and lists) names as "module:Name"."""
    tops = {module.split(".")[0] for module in plugin_modules(values)}
    return sorted({FROM_WORKING_DIRECTORY[n] for n in tops if n in FROM_WORKING_DIRECTORY})


def plugin_files(values: Any) -> dict[str, str]:
    """The SHA-256 of the source file of each plugin module that `values` names as
    "module:Name" and that is imported: a resume says when one changed since the run began."""
    import hashlib

    digests = {}
    for module in sorted(plugin_modules(values)):
        file = getattr(sys.modules.get(module), "__file__", None)
        if file and Path(file).is_file():
            digests[module] = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    return digests


def plugin_modules(values: Any) -> set[str]:
    """The modules that `values` (a config as nested dicts and lists) names as "module:Name"."""
    names: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, str) and ":" in value:
            names.add(value.partition(":")[0])

    walk(values)
    return names


def use_plugin_folders(folders: list[str]) -> None:
    """Put folders that runs recorded (`plugin_folders`) on the import path of this process and
    of the processes it starts (a study's workers), after what is there: the plugins a run
    imported from the directory it started in import again when it resumes from another."""
    for folder in folders:
        _RECORDED.add(folder)
        if folder not in sys.path and os.path.isdir(folder):
            sys.path.append(folder)
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), folder]))
