"""`fedsim config show`: the resolved config as TOML, every key followed by a comment with its
meaning and the values it takes, so that the output is both what a run would use and a
template to edit.

Values are written one per line by tomli-w (which gets the escaping right); lists and tables
are joined inline here, since tomli-w spreads every list over one line per item.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tomli_w

from fedsim.config.catalog import GENERATORS
from fedsim.config.schema import Config, algorithm_options, model_options, rule, selection_options


def show_config(config: Config) -> str:
    """TOML text that `config_from_dict` reads back as `config` (given the same origin).

    Generator and algorithm options that the config does not set are written commented out
    with their defaults: written as keys they would change the config (two algorithms may
    declare one key with different defaults, and an unset default has no TOML form).
    """
    lines = [f"# the resolved config of {config.source}: every key with what it means and the values it takes",
             "# (save it as a .toml file, edit it, and `fedsim run FILE`); [from ...] says where a value",
             "# came from when not from this file: a base it extends, or --set"]
    for section in dataclasses.fields(config):
        if section.name in ("source", "origins"):
            continue
        body = getattr(config, section.name)
        defaults = type(body)()
        lines += ["", f"# {type(body).__doc__}", f"[{section.name}]"]
        lines += [_line(f.name, getattr(body, f.name), _comment(rule(f), getattr(body, f.name),
                                                                 getattr(defaults, f.name))
                        + _from(config, section.name, f.name))
                  for f in dataclasses.fields(body) if f.name != "options"]
        lines += _option_lines(config, section.name)
    return "\n".join(lines) + "\n"


def _option_lines(config: Config, section: str) -> list[str]:
    """The keys that the chosen generator or algorithm(s) declare: set ones as keys, the
    others commented out with their defaults."""
    if section == "trace" and config.trace.source != "file":
        spec = GENERATORS.lookup(config.trace.source, config.where("trace", "source"))
        owner = f"generator {config.trace.source!r}"
        owners = {k: [(owner, d)] for k, d in spec.options.items()}
        given, lines = config.trace.options, [f"# {owner}: {' '.join(spec.doc.split())}"]
    elif section == "algorithm":
        owners = {}
        for name in dict.fromkeys([config.algorithm.name, *config.run.algorithms]):
            for k, d in algorithm_options(name, config.source).items():
                owners.setdefault(k, []).append((f"algorithm {name!r}", d))
        for k, d in selection_options(config.algorithm.selection).items():
            owners.setdefault(k, []).append((f"selection {config.algorithm.selection!r}", d))
        given, lines = config.algorithm.options, []
    elif section == "model" and model_options(config.model.name, config.source):
        owner = f"model {config.model.name!r}"
        owners = {k: [(owner, d)] for k, d in model_options(config.model.name, config.source).items()}
        given, lines = config.model.options, []
    else:
        return []
    for k, declared in owners.items():
        comment = "option of " + ", ".join(
            f"{owner} (default {'unset' if d is None else _literal(d)})" for owner, d in declared)
        if k in given:
            lines.append(_line(k, given[k], comment + _from(config, section, k)))
        else:
            default = declared[0][1]
            value = "<value>" if default is None else _literal(default)
            lines.append(f"# {_key(k)} = {value}  # {comment}")
    return lines


def _comment(ruled, value: Any, default: Any) -> str:
    """The key's meaning and rule; where the config sets another value, the default too (so a
    scenario's value does not read as fedsim's default)."""
    text = ruled.describe(default)
    return text if value == default else f"{text}; default {_literal(default)}"


def _from(config: Config, section: str, key: str) -> str:
    """Where a value was set, where it was not the config file itself: a base it extends, or --set."""
    origin = config.origins.get((section, key))
    return f" [from {origin}]" if origin and origin != config.source else ""


def _line(key: str, value: Any, comment: str) -> str:
    return f"{_key(key)} = {_literal(value)}  # {comment}"


def _key(key: str) -> str:
    """A key as TOML writes it: bare, or quoted where it has to be."""
    return tomli_w.dumps({key: 0})[: -len(" = 0\n")]


def _literal(value: Any) -> str:
    """One value on one line: scalars by tomli-w, lists and tables inline around them."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_literal(v)}" for k, v in value.items()) + "}"
    return tomli_w.dumps({"v": value})[len("v = "):-1]
