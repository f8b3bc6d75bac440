"""Studies: a base config swept over axes (algorithms x seeds x settings x learning rates),
every point an ordinary run directory, summarised over seeds with confidence intervals.

A study file is a config (its sections inline, and/or ``base = "file.toml"`` or a scenario
name) plus a ``[sweep]`` table: each ``"section.key" = [values]`` is an axis; axes combine as
a full grid, except those named together in ``zip = [["a.b", "c.d"]]``, which vary together.
Points run into ``<run.out>/<study>/<point>/``; running the study again skips the finished
points, resumes the interrupted ones from their checkpoints and runs the rest. Then
``study.parquet`` (every point's rounds, axis values as columns) and ``summary.parquet`` (per
group of points that differ only in ``run.seed``: mean, std and 95 % CI of the final and best
accuracy, final loss and time to each target) are written.

Optionally a ``[warm_start]`` table (``"section.key" = value``) makes the study two-phase: the
points' configs with those keys set run first, once per distinct config (``warm-start/NAME``),
and each point starts from its warm-start run's model (``[model] init_from``).
``[[claims]]`` tables state what the study should show (fedsim/results/claims.py); they are
recorded with the study and checked by ``fedsim report --claims``.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.config import (AlgorithmConfig, Config, DataConfig, TraceConfig, algorithm_options, config_from_dict,
                           is_study, parse_override, plain_folder_name, read_toml, scenario_names, scenario_path,
                           selection_options, trace_options)
from fedsim.config.layers import SET, Layered, drop_unselected, layered_config
from fedsim.config.schema import FILE_KEYS, _field_names, absolute_file_keys, first_origin, suggest, takes_one_value
from fedsim.errors import FedsimError, did_you_mean
from fedsim.files import resume_command

MAX_POINTS = 10_000  # more need --yes
SEED = "run.seed"
WARM = "warm_start"  # the study file's table of the first phase's keys
WARM_FOLDER = "warm-start"  # where the first phase's runs go in the study folder


@dataclass
class Point:
    name: str
    values: dict[str, Any]  # axis -> value
    config: Config


@dataclass
class Study:
    name: str
    source: str
    axes: dict[str, list]
    points: list[Point]
    folder: Path
    resolved: dict  # what study.toml records: the base config, the axes, the warm start, the claims
    gpus_per_task: float = 0.0  # the Ray backend's request per point
    warm: list[Point] = field(default_factory=list)  # the warm-start runs, before the points
    backend_flags: str = ""  # how the sweep that runs it was told to: ` --backend ray --address ...`

    def resume_command(self) -> str:
        """`fedsim sweep --resume FOLDER`, on the backend the study runs on (a Ray study's cluster)."""
        return resume_command("sweep", self.folder) + self.backend_flags

    @property
    def claims(self) -> list[dict]:
        return self.resolved.get("claims", [])

    @property
    def targets(self) -> list[float]:
        """The base config's `[run] targets`: the accuracies the plots and tables mark."""
        return list(self.resolved.get("base", {}).get("run", {}).get("targets", []))

    @property
    def group_axes(self) -> list[str]:
        """The axes a summary row stands for: every axis but the seed."""
        return [axis for axis in self.axes if axis != SEED]


def study_path(source: str) -> Path:
    path = Path(source)
    if not path.exists() and source in scenario_names():
        return scenario_path(source)
    return path


def load_study(source: str, overrides: list[str] = (), yes: bool = False) -> Study:
    """The study of a file (or a built-in scenario name) with --set overrides: `section.key=v`
    of its base config, `sweep.section.key=[...]` of an axis, `warm_start.section.key=v` of its
    first phase; every point's config is checked before anything runs."""
    path = study_path(source)
    given = path if path.is_dir() else None  # a study folder: the study runs there, wherever it was made
    raw = recorded_study(path) if given else read_toml(path)
    if given:
        path = path / "study.toml"
    elif isinstance(raw.get("base"), dict) and "axes" in raw:  # a study folder's study.toml, as a study file
        raw = as_study_file(read_recorded(path))
    sweep = raw.pop("sweep", None)
    if not isinstance(sweep, dict):
        raise FedsimError(f"{path}: no [sweep] table; a study gives its axes there, e.g. "
                          '[sweep] "run.seed" = [0, 1, 2] (use `fedsim run` for a single config)')
    warm = raw.pop(WARM, {})
    if not isinstance(warm, dict):
        raise FedsimError(f'{path}: {WARM} = {warm!r} must be a table of "section.key" = value')
    claims = raw.pop("claims", [])
    base, origins, only_base = _base(raw, path)
    set_keys, set_by = [], {}  # set_by: (sweep or warm_start, key) -> the --set that gave it
    for text in overrides:
        section, key, value = parse_override(text)
        if section == "sweep":
            sweep[key] = value
        elif section == WARM:
            warm[key] = value
        else:
            if isinstance(value, list) and takes_one_value(section, key):
                raise FedsimError(f"--set {text!r}: [{section}] {key} takes one value; to sweep over these, give "
                                  f"an axis: --set 'sweep.{section}.{key}={text.split('=', 1)[1].strip()}'")
            base.setdefault(section, {})[key] = value
            set_keys.append((text, f"{section}.{key}"))
            only_base.discard((section, key))
        (set_by if section in ("sweep", WARM) else origins)[(section, key)] = f"{SET} {text}"
    zips = sweep.pop("zip", [])
    gpus = sweep.pop("gpus_per_task", 0.0)
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0:
        raise FedsimError(f"{path}: [sweep] gpus_per_task = {gpus!r} must be a number >= 0")
    axes = _axes(sweep, base, path, set_by)
    if isinstance(base.get("trace"), dict) and "trace.source" not in axes:
        # a base's keys for another trace generator than the study's are dropped, as from a run's config
        base["trace"] = drop_unselected(Layered({"trace": base["trace"]}, origins, only_base))["trace"]
    for axis in axes:  # an axis sets its key in every point
        origins[_key(axis)] = set_by.get(("sweep", axis), f"axis {axis} of [sweep] in {path}")
    if "algorithm.name" not in sweep and "algorithm.name" in axes:  # the axis of [run] algorithms
        origins[("algorithm", "name")] = origins[("run", "algorithms")]
    for text, axis in set_keys:
        if axis in axes:
            raise FedsimError(f"--set {text!r}: {axis} is an axis of the sweep, which would override it; "
                              f"give its values with --set 'sweep.{axis}=[...]'")
    for key in warm:
        if "." not in key:
            raise FedsimError(f'{path}: [{WARM}] {key!r} is not a config key; write "section.key" = value, '
                              'e.g. "client.lr" = 0.1')
    grid = _grid(axes, zips, path)
    if len(grid) > MAX_POINTS and not yes:
        raise FedsimError(f"{path}: the sweep has {len(grid):,} points (over {MAX_POINTS:,}); pass --yes "
                          "to run them all, or shorten its axes")
    name = given.absolute().name if given else base.get("run", {}).get("name") or path.stem
    if not plain_folder_name(name):
        raise FedsimError(f"{origins.get(('run', 'name'), path)}: [run] name = {name!r} is not a plain folder name; give a name without "
                          "'/', '\\' or line breaks (the study folder is [run] out / name)")
    folder = given or Path(base.get("run", {}).get("out", "runs")) / name
    chosen = _study_choices(base, axes, warm)
    _check_algorithm_keys(base, chosen, origins, path)
    raws = []
    for values in grid:
        raw_point = {section: dict(body) for section, body in base.items()}
        for axis, value in values.items():
            _set(raw_point, axis, value)
        raws.append((_point_name(values, axes), values, raw_point))
    warm_origins = {**origins, **{_key(key): set_by.get((WARM, key), f"[{WARM}] {key} in {path}") for key in warm}}
    warm_points, warm_of = _warm_runs(raws, warm, axes, chosen, folder, path, warm_origins)
    for (point_name, values, raw_point), warm_name in zip(raws, warm_of):
        if warm_name is not None:
            _set(raw_point, "model.init_from", str(folder.absolute() / warm_name))  # (from any directory)
        raw_point.setdefault("run", {}).update(name=point_name, out=str(folder.absolute()))  # (from any directory)
        _own_keys(raw_point, chosen)
    points = _checked(raws, origins, path, "point")
    _unique_names(points, path)
    _refuse_repeats(points, path)
    absolute_file_keys(base, path)  # (the folder's study.toml names them from any directory)
    resolved = {"base": base, "axes": axes, "zip": zips, **({WARM: warm} if warm else {}),
                **({"gpus_per_task": gpus} if gpus else {})}
    resolved = json.loads(json.dumps(resolved))
    if claims:
        from fedsim.results.claims import check_claims

        resolved["claims"] = check_claims(claims, axes, str(path), {p.config.data.dataset for p in points})
    return Study(name, str(path), axes, points, folder, resolved, float(gpus), warm_points)


def recorded_study(folder: Path) -> dict:
    """A study folder's study.toml as a study file: its base config (with every --set it was
    run with) as recorded, axes, zips, warm start and claims (`fedsim sweep --resume FOLDER`;
    the study runs in FOLDER, whatever its base's [run] out and name say: it may have moved)."""
    recorded = Path(folder) / "study.toml"
    if not recorded.is_file():
        raise FedsimError(f"{folder}: not a study folder (no study.toml); pass the folder that `fedsim sweep` "
                          "printed after 'results:'")
    return as_study_file(read_recorded(recorded))


def as_study_file(resolved: dict) -> dict:
    """A study.toml as recorded (base, axes, zip, warm start, claims) in a study file's shape."""
    raw = {section: dict(body) for section, body in resolved["base"].items()}
    raw["sweep"] = {**resolved["axes"], "zip": resolved.get("zip", []),
                    "gpus_per_task": resolved.get("gpus_per_task", 0.0)}
    if WARM in resolved:
        raw[WARM] = resolved[WARM]
    if resolved.get("claims"):
        raw["claims"] = resolved["claims"]
    return raw


def _key(key: str) -> tuple[str, str]:
    section, name = key.split(".", 1)
    return section, name


def _set(raw: dict, key: str, value: Any) -> None:
    section, name = _key(key)
    raw.setdefault(section, {})[name] = value


def _checked(raws: list, origins: dict, path: Path, kind: str) -> list[Point]:
    """The points (or warm-start runs) with their configs, every one checked before anything
    runs. A key's own check blames where the key was set (`origins`: base config, --set,
    axis); a rule across keys blames the point, named by its values, since it is their
    combination that breaks it, or every point when all of them break it alike."""
    points, broken = [], []
    for name, values, raw in raws:
        described = ", ".join(f"{axis} = {value!r}" for axis, value in values.items())
        where = f"{path}: {kind} {name}" + (f" ({described})" if described else "")
        try:
            points.append(Point(name, values, config_from_dict(raw, origin=f"{path} {kind} {name}",
                                                               origins=origins, where=where)))
        except FedsimError as err:
            if not str(err).startswith(where):
                raise  # a key's own check, whose line names where the key was set
            broken.append((where, str(err)[len(where):]))
    if broken:
        where, why = broken[0]
        every = not points and len({reason for _, reason in broken}) == 1 and len(broken) > 1
        given = first_origin(why, origins, only_set=True)
        if given:  # a value given on the command line: blame that, for the points it breaks
            which = f"every {kind}" if every else f"{len(broken)} of the {len(raws)} {kind}s, the first " + \
                where[len(f"{path}: {kind} "):]
            raise FedsimError(f"{given}{why} ({which})")
        raise FedsimError(f"{path}: every {kind}{why}" if every else where + why)
    return points


# the keys whose value decides which options a section takes: ((section, key), default)
CHOOSERS = ((("algorithm", "name"), AlgorithmConfig.name), (("algorithm", "selection"), AlgorithmConfig.selection),
            (("trace", "source"), TraceConfig.source))
OPTIONS_OF = {("algorithm", "name"): algorithm_options, ("algorithm", "selection"): selection_options,
              ("trace", "source"): trace_options}


def _study_choices(base: dict, axes: dict[str, list], warm: dict) -> dict[tuple[str, str], list[str]]:
    """Every algorithm name, selection policy and trace source the study runs (strings only:
    config_from_dict judges the rest)."""
    chosen = {}
    for (section, key), default in CHOOSERS:
        names = [base.get(section, {}).get(key, default), warm.get(f"{section}.{key}"),
                 *axes.get(f"{section}.{key}", [])]
        chosen[(section, key)] = [n for n in dict.fromkeys(names) if isinstance(n, str)]
    return chosen


def _refuse_repeats(points: list[Point], path: Path) -> None:
    """Two points that are the same run (an axis of a key that some points' algorithm, policy or
    generator does not take leaves them equal) would run twice and be reported apart."""
    seen: dict[str, Point] = {}
    for point in points:
        config = point.config.to_dict()
        config["run"].pop("name")
        text = json.dumps(config, sort_keys=True, default=str)
        if text in seen:
            first = seen[text]
            differ = [axis for axis in point.values if point.values[axis] != first.values[axis]]
            same = ", ".join(f"{axis} = {value!r}" for axis, value in point.values.items() if axis not in differ)
            raise FedsimError(f"{path}: points {first.name} and {point.name} are the same run: {', '.join(differ)} "
                              f"{'does' if len(differ) == 1 else 'do'} not apply where {same}; zip "
                              f"{' and '.join(differ)} with the axis that chooses it (zip = [[...]]: docs/studies.md), "
                              "so that each run is a point once")
        seen[text] = point


def _check_algorithm_keys(base: dict, chosen: dict, origins: dict, path: Path) -> None:
    """A study of several algorithms: an [algorithm] key that none of them (nor their selection
    policies) takes is one line whose suggestion looks at all of them (a point's own check
    would name its first algorithm's keys only)."""
    algorithms = chosen[("algorithm", "name")]
    if len(algorithms) < 2 or not isinstance(base.get("algorithm"), dict):
        return
    try:
        valid = {*_field_names(AlgorithmConfig), *(k for name in algorithms for k in algorithm_options(name)),
                 *(k for policy in chosen[("algorithm", "selection")] for k in selection_options(policy))}
    except FedsimError:
        return  # an unknown name: the points' checks say so
    for key in base["algorithm"]:
        if key not in valid:
            raise FedsimError(f"{origins.get(('algorithm', key), path)}: unknown key [algorithm] {key} (none of the "
                              f"study's algorithms {', '.join(algorithms)} takes it); {suggest(key, valid)}")


def _own_keys(raw: dict, chosen: dict[tuple[str, str], list[str]]) -> None:
    """Drop the [algorithm] and [trace] keys that only another algorithm, selection policy or
    trace generator of the study takes (MIFA's `warmup` from a FedAvg point, Oort's keys from a
    uniform one, a generator's `p_min` from a trace-file point), as a comparison of
    `[run] algorithms` does; a key that none of the study's takes stays, and is an error."""
    for section_name in ("algorithm", "trace"):
        section = raw.get(section_name, {})
        choosers = [(owner, default) for owner, default in CHOOSERS if owner[0] == section_name]
        try:
            own = {k for owner, default in choosers for k in OPTIONS_OF[owner](section.get(owner[1], default))}
            others = {k for owner, _ in choosers for name in chosen[owner] for k in OPTIONS_OF[owner](name)}
        except FedsimError:
            continue  # an unknown name: config_from_dict says so
        for key in [k for k in section if k in others and k not in own]:
            del section[key]


def _warm_runs(raws: list, warm: dict, axes: dict[str, list], chosen: dict, folder: Path,
               path: Path, origins: dict) -> tuple[list[Point], list[str | None]]:
    """The warm-start runs (one per distinct config: each point's with the [warm_start] keys
    set) and, per point, its run's folder name under the study folder (None: no warm start).
    A run is named by the axes that tell the runs apart (`warm-start/seed-0`). `chosen`: the
    study's algorithm names, selection policies and trace sources (`_study_choices`)."""
    if not warm:
        return [], [None] * len(raws)
    keys, runs = [], {}
    for _, values, raw_point in raws:
        raw_warm = {section: dict(body) for section, body in raw_point.items()}
        for key, value in warm.items():
            _set(raw_warm, key, value)
        _own_keys(raw_warm, chosen)
        key = json.dumps(raw_warm, sort_keys=True, default=str)
        keys.append(key)
        runs.setdefault(key, (raw_warm, []))[1].append(values)
    def same(axis: str, values: list[dict]) -> bool:
        return len({json.dumps(v[axis]) for v in values}) == 1

    firsts = [members[0] for _, members in runs.values()]
    telling = [axis for axis in axes if axis not in warm and not same(axis, firsts)
               and all(same(axis, members) for _, members in runs.values())]
    names, warm_raws = {}, []
    for key, (raw_warm, members) in runs.items():
        values = {axis: members[0][axis] for axis in telling}
        short = _point_name(values, axes) if telling else "run"
        raw_warm.setdefault("run", {}).update(name=short, out=str(folder / WARM_FOLDER))
        names[key] = f"{WARM_FOLDER}/{short}"
        warm_raws.append((names[key], values, raw_warm))
    points = _checked(warm_raws, origins, path, "warm-start run")
    _unique_names(points, path)
    return points, [names[k] for k in keys]


def _base(raw: dict, path: Path) -> tuple[dict, dict, set]:
    """The study's base config: `base` (a file beside the study or a scenario), then the
    study's own sections over it; `[run] algorithms` becomes an axis of algorithm names.
    With it, where each (section, key) was set ("base config FILE"), for error lines, and the
    keys that only the base gave."""
    base_name = raw.pop("base", None)
    if base_name is None:  # `extends`, as in a run's config, is the same
        base_name = raw.pop("extends", None)
    base: dict = {}
    origins: dict[tuple[str, str], str] = {}
    only_base: set[tuple[str, str]] = set()
    if base_name is not None:
        if not isinstance(base_name, str):
            raise FedsimError(f"{path}: base = {base_name!r} must be a config file or scenario name")
        beside = path.parent / base_name
        base_path = beside if beside.exists() else study_path(base_name)
        base = read_toml(base_path)
        if not is_study(base):  # a base may extend another one
            layered = layered_config(base_path, file_is_base=True)
            base, only_base = layered.raw, layered.bases
            origins = {key: f"base config {label}" for key, label in layered.origins.items()}
        if is_study(base):
            raise FedsimError(f"{path}: base = {base_name!r} is a study, and a base is a config; run that "
                              f"study with --set overrides (--set 'sweep.run.seed=[...]'), or copy its "
                              "sections into this file")
    for section, body in raw.items():
        if not isinstance(body, dict):
            hint = did_you_mean(section, ["base", "extends"], end="? ")
            raise FedsimError(f"{path}: {section} = {body!r} is not a [section] table; {hint}a study has "
                              "`base`, config sections and [sweep]")
        base.setdefault(section, {}).update(body)
        origins.update({(section, key): f"base config {path}" for key in body})
        only_base -= {(section, key) for key in body}
    return base, origins, only_base


# keys that one study cannot vary per point, and what to use instead
FIXED_KEYS = {"run.name": "each point's folder is named after its values; name the study with [run] name",
              "run.out": "the points live in the study's folder; set [run] out for the whole study",
              "run.algorithms": 'sweep "algorithm.name" instead'}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _axes(sweep: dict, base: dict, path: Path, set_by: dict) -> dict[str, list]:
    """The sweep's axes, checked; a bad one is blamed on the --set that gave it, else the file."""
    axes = {}
    for axis, values in sweep.items():
        where = set_by.get(("sweep", axis), path)
        if "." not in axis:
            raise FedsimError(f'{where}: [sweep] {axis!r} is not a config key; write "section.key" = '
                              '[values], e.g. "client.lr" = [0.01, 0.1]')
        if not isinstance(values, list) or not values:
            raise FedsimError(f"{where}: [sweep] {axis!r} = {values!r} must be a non-empty list of values")
        if axis in FIXED_KEYS:
            raise FedsimError(f"{where}: [sweep] {axis!r} cannot vary per point ({FIXED_KEYS[axis]})")
        axes[axis] = values
    algorithms = base.get("run", {}).pop("algorithms", [])
    if algorithms and "algorithm.name" not in axes:
        axes = {"algorithm.name": list(algorithms), **axes}
    if not axes:
        raise FedsimError(f"{path}: [sweep] has no axes; give at least one, e.g. \"run.seed\" = [0, 1, 2]")
    return axes


def _grid(axes: dict[str, list], zips: list, path: Path) -> list[dict[str, Any]]:
    """Every point: the full product of the axes, where each zip group counts as one axis."""
    if not isinstance(zips, list) or not all(isinstance(g, list) for g in zips):
        raise FedsimError(f'{path}: [sweep] zip = {zips!r} must be a list of lists of axes, e.g. '
                          'zip = [["client.lr", "client.local_steps"]]')
    grouped = [axis for group in zips for axis in group]
    if any(not group for group in zips):
        raise FedsimError(f"{path}: [sweep] zip = {zips!r} has an empty group; each group names the axes "
                          'that vary together, e.g. zip = [["client.lr", "client.local_steps"]]')
    for axis in grouped:
        if axis not in axes:
            raise FedsimError(f"{path}: [sweep] zip names {axis!r}, which is not an axis of the sweep")
        if grouped.count(axis) > 1:
            raise FedsimError(f"{path}: [sweep] zip names {axis!r} in more than one group (or twice); an "
                              "axis varies together with one group of axes")
    factors = []
    for group in zips:
        lengths = {len(axes[axis]) for axis in group}
        if len(lengths) > 1:
            raise FedsimError(f"{path}: [sweep] zip {group} has axes of different lengths; axes that "
                              "vary together need as many values each")
        factors.append([dict(zip(group, values)) for values in zip(*(axes[a] for a in group))])
    factors += [[{axis: v} for v in values] for axis, values in axes.items() if axis not in grouped]
    grid = [{axis: combo[axis] for axis in axes}
            for combo in ({k: v for part in parts for k, v in part.items()} for parts in itertools.product(*factors))]
    seen = [json.dumps({a: float(v) if _number(v) else v for a, v in point.items()}, sort_keys=True) for point in grid]
    twice = next((grid[i] for i, key in enumerate(seen) if key in seen[:i]), None)
    if twice is not None:
        alike = any(len({repr(v) for v in values}) > len({json.dumps(float(v) if _number(v) else v) for v in values})
                    for values in axes.values())  # (values equal as numbers, written differently)
        raise FedsimError(f"{path}: [sweep] the point {twice} comes twice{' (1 and 1.0 are one value)' if alike else ''}"
                          "; give each value of an axis once")
    return grid


def _point_name(values: dict[str, Any], axes: dict[str, list]) -> str:
    """`algorithm-fedavg_seed-0`: each axis by the last part of its key (algorithm for
    algorithm.name), the full key where two axes share a last part."""
    lasts = [axis.split(".")[-1] for axis in axes]
    parts = []
    for axis, value in values.items():
        short = "algorithm" if axis == "algorithm.name" else axis.split(".")[-1]
        if lasts.count(axis.split(".")[-1]) > 1:
            short = axis.replace(".", "-")
        text = "-".join(map(str, value)) if isinstance(value, list) else str(value)
        parts.append(f"{short}-{text}")
    name = "_".join(parts)
    return "".join(c if c.isalnum() or c in "-_.+" else "-" for c in name) or "point"


def _unique_names(points: list[Point], path: Path) -> None:
    seen: dict[str, Point] = {}
    for point in points:
        if point.name in seen:
            raise FedsimError(f"{path}: points {seen[point.name].values} and {point.values} get the same "
                              f"folder name {point.name!r}; give the axes distinct values")
        seen[point.name] = point


# -- running ----------------------------------------------------------------------------------

def check_same_study(study: Study) -> str:
    """A study folder holds one study: running another into it is refused, unless none of its
    runs ever started (a sweep that stopped before its first point, e.g. for missing data, is
    then run again with a fixed --set, not refused as another study). The note to print once
    the points' own checks pass where the study file changes keys a resume may change ("" if
    none)."""
    recorded = study.folder / "study.toml"
    if recorded.exists():
        before = _flat(_what_runs(json.loads(json.dumps(read_recorded(recorded)))))
        now = _flat(_what_runs(study.resolved))
        differs = next((key for key in {**before, **now} if before.get(key) != now.get(key)), None)
        if differs is not None and _has_runs(study.folder):
            raise FedsimError(f"{study.folder}: holds a different study ({differs} is "
                              f"{_shown(before, differs)} in its study.toml, {_shown(now, differs)} in "
                              f"{study.source}); run `{resume_command('sweep', study.folder)}` to go on with "
                              "it as it was, or give this one another [run] name")
        if _has_runs(study.folder) and Path(study.source) != recorded:
            return _resume_keys_changed(study, read_recorded(recorded))
    return ""


def _resume_keys_changed(study: Study, recorded: dict) -> str:
    """One line when the study file changes keys a resume may change (more rounds, a later
    max_time): its points resume to them, as `--resume --set` would make them ("" if none)."""
    from fedsim.config import RESUME_KEYS

    before, now = (_flat(r.get("base", {}).get("run", {}), "run.") for r in (recorded, study.resolved))
    changed = [f"{key} = {_shown(now, key)} (was {_shown(before, key)})" for key in RESUME_KEYS
               if key.startswith("run.") and key not in ("run.progress", "run.plots") and before.get(key) != now.get(key)]
    return (f"note: {study.folder}: {study.source} gives {', '.join(changed)}: the study's points go on to it from "
            "where they are, as `fedsim sweep --resume` with that --set would") if changed else ""


# the keys of a point that do not tell studies apart: where the study folder is (it may move)
PLACE_KEYS = ("run.name", "run.out", "trace.path", "trace.devices_table", "model.init_from")


def check_own_runs(study: Study) -> None:
    """Each run already in the study folder (one with a checkpoint or manifest) is a run of
    this study that ran with the values it sets (the keys a resume may change aside): otherwise the folder holds another study's
    runs (its study.toml was replaced by another study's, or deleted), which would be skipped
    or resumed as this one's. A path (trace, warm start) must name the same file."""
    from fedsim.results.run_format import format_of, upgrade
    from fedsim.runs.experiment import first_change

    mine = {p.name: p for p in [*study.warm, *study.points]}
    keys = {(section, key) for section, body in study.resolved["base"].items() if isinstance(body, dict)
            for key in body} | {_key(axis) for axis in [*study.axes, *study.resolved.get(WARM, {})]}
    replaced = Path(study.source) == study.folder / "study.toml"
    fix = ("its study.toml is not the one these runs ran with: put that one back, or run this study from its "
           "file with another [run] name" if replaced else "give this one another [run] name, or delete the folder")
    for config_file in sorted([*study.folder.glob("*/config.toml"), *study.folder.glob(f"{WARM_FOLDER}/*/config.toml")]):
        run_dir = config_file.parent
        name = run_dir.relative_to(study.folder).as_posix()
        if not ((run_dir / "checkpoint.pt").exists() or (run_dir / "manifest.json").exists()):
            continue  # a run that never began: a point starts it over
        if name not in mine:
            raise FedsimError(f"{study.folder}: holds a different study (its run {name} is no point of the study "
                              f"in {study.source}); {fix}")
        try:
            ran, _ = upgrade(read_toml(config_file), format_of(run_dir), str(config_file))
        except FedsimError:
            continue  # a damaged config.toml: the run's own resume says so
        ran, now = _only(ran, keys), _only(mine[name].config.to_dict(), keys)  # (defaults change)
        change = first_change(ran, now, PLACE_KEYS) or _other_file(ran, now, study.folder)
        if change is not None:
            section, key, old, new = change
            raise FedsimError(f"{study.folder}: holds a different study (its run {name} ran with [{section}] {key} = "
                              f"{old!r}, the study in {study.source} gives {new!r}); {fix}")


def _only(config: dict, keys: set[tuple[str, str]]) -> dict:
    """The `(section, key)`s of `keys` that a config dict has."""
    return {section: {k: v for k, v in body.items() if (section, k) in keys}
            for section, body in config.items() if isinstance(body, dict)}


def _other_file(ran: dict, now: dict, folder: Path) -> tuple[str, str, Any, Any] | None:
    """A trace file or warm start (`model.init_from`) that a run read and its point now names
    another of, compared as files: the study folder, and the folder a sweep runs in, may move
    (a file that moved is judged by the run's own checks)."""
    for section, key in FILE_KEYS:
        old, new = ran.get(section, {}).get(key), now.get(section, {}).get(key)
        if old == new:
            continue
        if not (old and new):
            same = False
        elif Path(new).resolve().is_relative_to(folder.resolve()):  # a warm-start run of the study
            same = Path(old).parts[-2:] == Path(new).parts[-2:]
        else:
            same = not (Path(old).exists() and Path(new).exists()) or Path(old).samefile(new)
        if not same:
            return section, key, old, new
    return None


def _flat(table: dict, prefix: str = "") -> dict[str, Any]:
    """`{"base": {"client": {"lr": 0.1}}}` as `{"base.client.lr": 0.1}`."""
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shown(flat: dict, key: str) -> str:
    return repr(flat[key]) if key in flat else "unset"


def _has_runs(folder: Path) -> bool:
    """Whether a study folder holds anything of its runs (any file but its lock, study.toml and
    the id of its MLflow parent run)."""
    return any(f.is_file() and f.relative_to(folder).as_posix() not in (".lock", "study.toml", "mlflow.json")
               for f in folder.rglob("*"))


def read_recorded(recorded: Path) -> dict:
    """A study folder's study.toml, or one line saying how to recover from a damaged one (its
    finished points are kept: the sweep skips them once the file is written again)."""
    fix = (f"delete it and run `fedsim sweep` on the study file again: the points already in "
           f"{recorded.parent} are kept and skipped")
    try:
        resolved = read_toml(recorded)
    except FedsimError as err:
        raise FedsimError(f"{recorded}: damaged ({str(err).split(': ', 1)[-1]}); {fix}") from None
    if not isinstance(resolved.get("base"), dict) or not isinstance(resolved.get("axes"), dict):
        raise FedsimError(f"{recorded}: damaged (no base config and axes in it); {fix}")
    return resolved


def _what_runs(resolved: dict) -> dict:
    """A study.toml without what may change between two sweeps of one study: its claims (they
    judge the results, they do not make them) and the [run] keys a resumed run may change
    (more rounds, plots, evaluation, trackers: the points resume to them), and its trace file and
    warm start, which `check_own_runs` compares as files (a study.toml may name them relatively)."""
    from fedsim.config import RESUME_KEYS

    growing = {key.split(".", 1)[1] for key in RESUME_KEYS if key.startswith("run.")}
    base = dict(resolved.get("base", {}))
    base["run"] = {k: v for k, v in base.get("run", {}).items() if k not in growing}
    for section, key in FILE_KEYS:  # files: compared as files by check_own_runs
        if isinstance(base.get(section), dict):
            base[section] = {k: v for k, v in base[section].items() if k != key}
    return {key: value for key, value in {**resolved, "base": base}.items() if key != "claims"}


def study_datasets(study: Study) -> set[str]:
    """The datasets a study's points train on: its axis of them, else its base config's."""
    if "data.dataset" in study.axes:
        return set(study.axes["data.dataset"])
    data = study.resolved.get("base", {}).get("data")
    return {data.get("dataset", DataConfig.dataset) if isinstance(data, dict) else DataConfig.dataset}


def open_study(folder: Path) -> Study:
    """The study recorded in a study folder (its study.toml), for reports and plots."""
    folder = Path(folder)
    recorded = folder / "study.toml"
    if not recorded.exists():
        raise FedsimError(f"{folder}: not a study folder (no study.toml); pass the folder that "
                          "`fedsim sweep` printed after 'results:'")
    resolved = read_recorded(recorded)
    axes, zips = resolved["axes"], resolved.get("zip", [])
    points = [Point(_point_name(values, axes), values, None) for values in _grid(axes, zips, recorded)]
    missing = [p.name for p in points if not (folder / p.name / "rounds.parquet").exists()]
    if missing:
        raise FedsimError(f"{folder}: point {missing[0]} has not run yet ({len(missing)} of "
                          f"{len(points)} missing); run `{resume_command('sweep', folder)}` to finish it")
    return Study(folder.name, str(folder), axes, points, folder, resolved)


