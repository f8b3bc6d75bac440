"""A config made of layers: `extends = "SCENARIO" | "path.toml"` chains of bases, then the
file, then `--set`; where each value came from (for `fedsim config show` and error lines).

Keys that a base gives for a trace generator or an algorithm that the final config does not
select are dropped: the user did not write them (`fedsim run quickstart --set
trace.source=file ...` leaves the quickstart's `p_min` behind). The same keys written in the
user's own file or by `--set` stay errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fedsim.config.schema import (DEVICE_MODEL_KEYS, AlgorithmConfig, Config, DevicesConfig, TraceConfig,
                                  _declared_options, _field_names,
                                  config_from_dict, is_study, parse_override, read_toml, scenario_names,
                                  scenario_path)
from fedsim.errors import FedsimError

SET = "--set"
MAX_EXTENDS = 64  # files in one `extends` chain: far more than any layering needs, far below Python's recursion


@dataclass
class Layered:
    raw: dict  # the merged sections
    origins: dict[tuple[str, str], str] = field(default_factory=dict)  # (section, key) -> where it was set
    bases: set[tuple[str, str]] = field(default_factory=set)  # keys that only a base gave


def layered_config(path: Path, overrides: list[str] = (), *, file_is_base: bool = False) -> Layered:
    """The sections of `path` over its `extends` chain, then `overrides` (`section.key=value`)."""

    merged = Layered({})
    for label, raw, is_base in read_layers(Path(path), file_is_base=file_is_base):
        _merge(merged, raw, label, is_base)
    for text in overrides:
        section, key, value = parse_override(text)
        if not isinstance(merged.raw.setdefault(section, {}), dict):
            raise FedsimError(f"--set {text!r}: [{section}] is not a table")
        _merge(merged, {section: {key: value}}, f"{SET} {text}", False)
    return merged


def read_layers(path: Path, *, file_is_base: bool = False, chain: tuple[Path, ...] = ()) -> list[tuple[str, dict, bool]]:
    """(label, sections, is a base) from the deepest base to `path`: `extends` names a scenario
    or a file (beside the one that names it first, then from the working directory); a chain
    holds at most MAX_EXTENDS files below `path`."""

    resolved = path.resolve()
    if resolved in chain:
        names = " -> ".join(p.name for p in (*chain, resolved))
        raise FedsimError(f"{chain[0]}: extends goes round in a circle ({names}); remove one of the extends")
    if len(chain) == MAX_EXTENDS:
        raise FedsimError(f"{chain[0]}: extends goes deeper than {MAX_EXTENDS} files ({chain[0].name} -> "
                          f"{chain[1].name} -> ... -> {chain[-1].name} -> {path.name} -> ...); fedsim follows at most "
                          f"{MAX_EXTENDS}: merge some of the files into one")
    raw = read_toml(path)
    base = raw.pop("extends", None)
    builtin = path.resolve().parent == scenario_path("quickstart").resolve().parent
    label = f"{path.stem} (built-in scenario)" if builtin and chain else str(path)
    layers = [(label, raw, file_is_base or builtin or bool(chain))]
    if base is None:
        return layers
    if not isinstance(base, str) or not base:
        raise FedsimError(f"{path}: extends = {base!r} must name a scenario ({', '.join(scenario_names())}) or a "
                          ".toml file")
    beside = path.parent / base
    if beside.is_file():
        base_path = beside
    elif Path(base).is_file():
        base_path = Path(base)
    elif base in scenario_names():
        base_path = scenario_path(base)
    else:
        raise FedsimError(f"{path}: extends = {base!r} is neither a file (beside it or in the working directory) "
                          f"nor a scenario ({', '.join(scenario_names())})")
    return read_layers(base_path, chain=(*chain, resolved)) + layers


def _merge(into: Layered, raw: dict, label: str, is_base: bool) -> None:
    for section, body in raw.items():
        if not isinstance(body, dict):  # config_from_dict says what is wrong with it
            into.raw[section] = body
            continue
        into.raw.setdefault(section, {})
        for key, value in body.items():
            into.raw[section][key] = value
            into.origins[(section, key)] = label
            (into.bases.add if is_base else into.bases.discard)((section, key))


def drop_unselected(layered: Layered) -> dict:
    """The sections without the generator, algorithm and device-model keys that only a base
    gave and that the final config's generator, algorithms or device model do not take."""

    raw = {s: dict(b) if isinstance(b, dict) else b for s, b in layered.raw.items()}
    algorithms = raw.get("run", {}).get("algorithms", []) if isinstance(raw.get("run"), dict) else []
    for section, cls in (("trace", TraceConfig), ("algorithm", AlgorithmConfig)):
        body = raw.get(section)
        if not isinstance(body, dict):
            continue
        try:
            declared = _declared_options(section, body, algorithms if isinstance(algorithms, list) else [],
                                         layered.origins.get((section, "source" if section == "trace" else "name"),
                                                             "config"))
        except FedsimError:
            continue  # an unknown generator or algorithm: config_from_dict says so
        known = set(_field_names(cls)) | set(declared or {})
        for key in list(body):
            if key not in known and (section, key) in layered.bases:
                del body[key]
    devices = raw.get("devices")
    if isinstance(devices, dict):
        model = devices.get("model", DevicesConfig.model)
        for key in list(devices):
            if model not in DEVICE_MODEL_KEYS.get(key, (model,)) and ("devices", key) in layered.bases:
                del devices[key]
    return raw


def load_config(source: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Load a config file (or a built-in scenario by name; None = quickstart) plus overrides."""
    path, layered = _layers_of(source, overrides)
    return config_from_dict(drop_unselected(layered), origin=str(path), origins=layered.origins)


def draws_plots(source: str | Path | None = None, overrides: list[str] = ()) -> bool:
    """Whether the config's `[run] plots` is on, read without validating the config (which
    imports torch), so that the CLI starts its plot worker only for a run that draws; a config
    that cannot be read draws none (load_config says why)."""
    try:
        _, layered = _layers_of(source, overrides)
    except FedsimError:
        return False
    run = layered.raw.get("run")
    return not isinstance(run, dict) or run.get("plots", True) is not False


def _layers_of(source, overrides) -> tuple[Path, Layered]:
    """The file of `source` (a path or a built-in scenario's name) and its layers with `overrides`."""
    if source is None:
        source = "quickstart"
    if not isinstance(source, (str, Path)):
        raise FedsimError(f"load_config: expected a config path or scenario name, got {source!r}")
    if isinstance(overrides, str) or not all(isinstance(o, str) for o in overrides):
        raise FedsimError(f"load_config: overrides must be a list of 'section.key=value' strings, "
                          f"got {overrides!r}")
    path = Path(source)
    builtin = not path.exists() and str(source) in scenario_names()
    if builtin:
        path = scenario_path(str(source))
    raw = read_toml(path)
    if is_study(raw):
        raise FedsimError(f"{path}: is a study (it has axes to sweep); run it with `fedsim sweep {source}`")
    return path, layered_config(path, list(overrides), file_is_base=builtin)
