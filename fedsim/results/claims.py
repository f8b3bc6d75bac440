"""Claims: what a study should show, written as checks over its results, so that
`fedsim report STUDY --claims` says which hold (docs/reproductions.md).

A claim is a ``[[claims]]`` table of the study file; it compares the points that `better`
selects with those that `than` selects, paired by seed (same seed, same data, same trace):

    [[claims]]
    claim = "MIFA beats biased FedAvg"      # the sentence the report shows
    metric = "final_acc"                    # see METRICS; tail_* and loss_swing need `window`
    better = {"algorithm.name" = "mifa"}    # these points ...
    than = {"algorithm.name" = "fedavg"}    # ... against these (a value or a list per axis)
    where = {"trace.p_min" = [0.05, 0.1]}   # optional: only these points
    grows_as = {"trace.p_min" = "falls"}    # optional: the advantage at the smallest p_min
                                            # exceeds the one at the largest ("rises": reverse)
    at_least = -0.01                        # optional: the advantage must exceed this (default 0;
                                            # -0.01: A is no more than 1 point below B)
    within = 0.01                           # optional: instead, A matches B within this margin
    best_over = "client.lr"                 # optional: each side at its best value of the axis
    window = 100                            # rounds, for tail_acc, tail_loss, loss_swing
    target = 0.7                            # accuracy, for time_to_acc

Every axis the claim does not name (but the seed) splits it into groups, and the claim must
hold in each. Per group the statistic is computed per seed, and the whole 95 % CI of its mean
decides, not the mean alone: `holds` when the CI lies on the claimed side (above `at_least`;
for `within`, inside (-margin, margin)), `does not hold` when it lies on the other side (at or
below `at_least`; for `within`, wholly outside the margin), `inconclusive` when it straddles
the boundary, or with one seed (no CI). An inconclusive group says about how many more seeds
would decide it, were the mean and sd to stay as measured. A claim's verdict is that of its
worst group. A time claim also gives the ratio `than` / `better` per seed (how many times
faster), with its CI. A point that never reaches a time_to_acc target has no time: it is left
out, and the verdict says how many were.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from fedsim.config import NO_ACCURACY_DATASETS
from fedsim.errors import FedsimError, choice_error, did_you_mean
from fedsim.results.report import ci95, duration, finite, table_text, time_to_target
from fedsim.results.run_format import read_manifest
from fedsim.results.status import initial_evaluation

SEED = "run.seed"
# metric -> (what it is, whether higher is better)
METRICS = {
    "final_acc": ("test accuracy at the last evaluation", True),
    "best_acc": ("best test accuracy over the evaluations", True),
    "final_loss": ("test loss at the last evaluation", False),
    "tail_acc": ("mean test accuracy over the last `window` rounds", True),
    "tail_loss": ("mean test loss over the last `window` rounds", False),
    "loss_swing": ("max - min test loss over the last `window` rounds (oscillation)", False),
    "round_s": ("mean simulated duration of a round, seconds", False),
    "sim_time": ("simulated time at the end of the last round, seconds", False),
    "time_to_acc": ("simulated time at which test accuracy first reached `target`, seconds (as `fedsim "
                    "report` tells it)", False),
}
WINDOWED = ("tail_acc", "tail_loss", "loss_swing")
ACCURACY_METRICS = ("final_acc", "best_acc", "tail_acc")
NEEDS_ACCURACY = (*ACCURACY_METRICS, "time_to_acc")
TIMES = ("round_s", "sim_time", "time_to_acc")  # simulated seconds: lower is better
KEYS = ("claim", "metric", "better", "than", "where", "grows_as", "at_least", "within", "best_over", "window",
        "target")
HOLDS, FAILS, UNSURE = "holds", "does not hold", "inconclusive"
MORE_SEEDS_CAP = 1000  # the most extra seeds an inconclusive verdict looks ahead


# -- checking the tables ----------------------------------------------------------------------

def check_claims(claims, axes: dict[str, list], where: str, datasets: set[str] = frozenset()) -> list[dict]:
    """The [[claims]] tables, each checked against the study's axes and the datasets its
    points train on (one error line for the first problem)."""
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise FedsimError(f"{where}: claims must be [[claims]] tables (an array of tables)")
    checked = [_check(claim, axes, f"{where}: claim {k + 1}") for k, claim in enumerate(claims)]
    for k, claim in enumerate(checked):
        metric_exists(claim, datasets, f"{where}: claim {k + 1} ({claim['claim']!r})")
    return checked


def metric_exists(claim: dict, datasets: set[str], where: str) -> None:
    """An accuracy claim on a study whose every point is a task without accuracy (the quadratic
    one) is refused for its metric, not left to find no points."""
    metric = claim["metric"]
    if metric in NEEDS_ACCURACY and datasets and set(datasets) <= set(NO_ACCURACY_DATASETS):
        usable = ", ".join(m for m in METRICS if m not in NEEDS_ACCURACY)
        raise FedsimError(f"{where}: metric {metric!r} ({METRICS[metric][0]}) does not exist for the "
                          f"{' and '.join(sorted(datasets))} task, which has no classes and so no accuracy; use "
                          f"one it has: {usable}")


def _check(claim: dict, axes: dict[str, list], where: str) -> dict:
    for key in claim:
        if key not in KEYS:
            raise FedsimError(f"{where}: unknown key {key!r}; {did_you_mean(key, KEYS) or 'keys: ' + ', '.join(KEYS)}")
    for key in ("claim", "metric", "better", "than"):
        if key not in claim:
            raise FedsimError(f"{where}: no {key!r}; a claim needs claim, metric, better and than")
    if not isinstance(claim["claim"], str) or not claim["claim"].strip():
        raise FedsimError(f"{where}: claim = {claim['claim']!r} must be the sentence the report shows")
    where = f"{where} ({claim['claim']!r})"
    if claim["metric"] not in METRICS:
        raise choice_error(f"{where}: metric", claim["metric"], list(METRICS))
    window = claim.get("window")
    if claim["metric"] in WINDOWED and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise FedsimError(f"{where}: metric {claim['metric']!r} needs window = ROUNDS (an integer >= 1), "
                          f"got {window!r}")
    target = claim.get("target")
    if claim["metric"] == "time_to_acc" and (not _number(target) or not 0 < target <= 1):
        raise FedsimError(f"{where}: metric 'time_to_acc' needs target = ACCURACY (a number in (0, 1], "
                          f"0.7 = 70 %), got {target!r}")
    if claim["metric"] != "time_to_acc" and target is not None:
        raise FedsimError(f"{where}: target applies to metric 'time_to_acc', not {claim['metric']!r}; remove it")
    free = [a for a in axes if a != SEED]
    for key in ("better", "than", "where"):
        _check_selection(claim.get(key, {}), key, axes, where)
    if not claim["better"] or not claim["than"]:
        raise FedsimError(f"{where}: better and than must each select points, e.g. "
                          'better = {"algorithm.name" = "mifa"}')
    grows = claim.get("grows_as")
    if grows is not None:
        if not isinstance(grows, dict) or len(grows) != 1:
            raise FedsimError(f'{where}: grows_as = {grows!r} must name one axis, e.g. {{"trace.p_min" = "falls"}}')
        (axis, direction), = grows.items()
        if axis not in free or len(axes[axis]) < 2:
            raise FedsimError(f"{where}: grows_as {axis!r} is not an axis of the study with 2 or more values "
                              f"(axes: {', '.join(free)})")
        if direction not in ("falls", "rises"):
            raise FedsimError(f"{where}: grows_as {axis!r} = {direction!r} must be \"falls\" or \"rises\"")
    within, at_least = claim.get("within"), claim.get("at_least")
    if within is not None and (not _number(within) or within <= 0):
        raise FedsimError(f"{where}: within = {within!r} must be a margin > 0 (0.01 = 1 point of accuracy)")
    if at_least is not None and not _number(at_least):
        raise FedsimError(f"{where}: at_least = {at_least!r} must be a number (-0.01: at most 1 point worse)")
    if within is not None and (grows is not None or at_least is not None):
        raise FedsimError(f"{where}: within is a claim of its own; give it without grows_as and at_least")
    best = claim.get("best_over")
    if best is not None and best not in free:
        raise FedsimError(f"{where}: best_over = {best!r} is not an axis of the study (axes: {', '.join(free)})")
    return claim


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _check_selection(selection, key: str, axes: dict[str, list], where: str) -> None:
    if not isinstance(selection, dict):
        raise FedsimError(f'{where}: {key} = {selection!r} must be a table of axis = value(s), e.g. '
                          '{"algorithm.name" = "mifa"}')
    for axis, wanted in selection.items():
        if axis not in axes or axis == SEED:
            raise FedsimError(f"{where}: {key} names {axis!r}, which is not an axis of the study "
                              f"(axes: {', '.join(a for a in axes if a != SEED)})")
        for value in wanted if isinstance(wanted, list) else [wanted]:
            if value not in axes[axis]:
                raise FedsimError(f"{where}: {key} {axis} = {value!r} is not a value of that axis "
                                  f"({', '.join(map(repr, axes[axis]))})")


# -- measuring ----------------------------------------------------------------------------------

def point_metric(study: pl.DataFrame, metric: str, window: int | None = None,
                 target: float | None = None, initial: dict[str, dict] | None = None) -> pl.DataFrame:
    """`point` and `value`: the metric of each point, from study.parquet's rounds (time_to_acc:
    the report's time to target, from the point's `initial` evaluation; null where the point
    never reached `target`)."""
    frame = study.sort(["point", "round"])
    if metric == "time_to_acc":
        points = frame.partition_by("point", maintain_order=True)
        hits = [time_to_target(p, target, (initial or {}).get(p["point"][0])) for p in points]
        return pl.DataFrame({"point": [p["point"][0] for p in points], "value": [h.time_s if h else None for h in hits]},
                            schema={"point": frame.schema["point"], "value": pl.Float64})
    if metric in WINDOWED:  # the study's last rounds; a point that stopped early (diverged) has none
        last = pl.col("round").max()
        frame = frame.filter((last.over("point") == last) & (pl.col("round") > last - window))
    acc, loss = finite("test_acc"), finite("test_loss")
    value = {"final_acc": acc.drop_nulls().last(), "best_acc": acc.max(), "final_loss": loss.drop_nulls().last(),
             "tail_acc": acc.mean(), "tail_loss": loss.mean(), "loss_swing": loss.max() - loss.min(),
             "round_s": pl.col("duration").mean(), "sim_time": pl.col("t_end").last()}[metric]
    values = frame.group_by("point", maintain_order=True).agg(value.alias("value"))
    if metric == "best_acc" and initial:  # from the initial model's evaluation on, as the report's
        first = pl.Series([(initial.get(p) or {}).get("test_acc") for p in values["point"]], dtype=pl.Float64)
        values = values.with_columns(pl.max_horizontal("value", first))
    return values


@dataclass
class Group:
    """One group of a claim: what was compared and the statistic over the seeds."""

    label: str
    values: list[float]
    verdict: str
    note: str = ""  # an inconclusive group: what would decide it ("about 6 more seeds")
    ratios: list[float] = field(default_factory=list)  # time metrics: than / better per seed

    @property
    def verdict_text(self) -> str:
        return f"{self.verdict} ({self.note})" if self.note else self.verdict

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def ci(self) -> float | None:
        return _ci(self.values)

    @property
    def ratio(self) -> tuple[float, float | None] | None:
        """The mean ratio than / better over the seeds and its CI half-width (time metrics)."""
        return (float(np.mean(self.ratios)), _ci(self.ratios)) if self.ratios else None


def _ci(values: list[float]) -> float | None:
    return ci95([np.std(values, ddof=1) if len(values) > 1 else None], [len(values)])[0]


@dataclass
class Verdict:
    claim: dict
    groups: list[Group]
    verdict: str
    decisive: Group  # the group that decides: the worst one
    unreached: int = 0  # time_to_acc: points left out because they never reached the target

    @property
    def verdict_text(self) -> str:
        n = self.unreached
        left_out = f"; {n} point{'s' * (n > 1)} never reached the target, left out" if n else ""
        return self.decisive.verdict_text + left_out


def judge(claim: dict, study: pl.DataFrame, axes: dict[str, list], zips: list[list[str]] = (),
          initial: dict[str, dict] | None = None) -> Verdict:
    """The claim checked on a study's rounds (study.parquet, axis values as columns; `initial`:
    each point's initial evaluation); an axis zipped with one the claim names (a learning rate
    per algorithm) goes with it."""
    higher = METRICS[claim["metric"]][1]
    metric = point_metric(study, claim["metric"], claim.get("window"), claim.get("target"), initial)
    if metric["value"].is_null().all() and claim["metric"] == "time_to_acc":
        raise FedsimError(f"claim {claim['claim']!r}: no point of the study reached test accuracy {claim['target']:g} "
                          "(metric 'time_to_acc'); lower the claim's target or run the study longer")
    if metric["value"].is_null().all():
        raise FedsimError(f"claim {claim['claim']!r}: metric {claim['metric']!r} has no value in any point of the "
                          f"study (no run recorded a finite {METRICS[claim['metric']][0]}); see why with "
                          "`fedsim report` on the study")
    points = _select(study.select("point", *axes).unique("point", maintain_order=True).join(metric, on="point"),
                     claim.get("where", {}))
    unreached = points["value"].null_count() if claim["metric"] == "time_to_acc" else 0
    points = points.drop_nulls("value")
    sides = {a for a in axes if a in claim["better"] or a in claim["than"]}
    sides |= {a for group in zips if sides & set(group) for a in group}
    named = [a for a in axes if a in sides]
    best = claim.get("best_over")
    pair_on = [a for a in axes if a not in named and a != best]
    sides = []
    for key, prefix in (("better", "a"), ("than", "b")):
        side = _select(points, claim[key])
        shown = [a for a in named if a in claim[key] or side[a].n_unique() > 1]
        side = side.with_columns(side=_label(shown))
        if best:
            side = _best_of(side, best, pair_on, higher)
        sides.append(side.select(*pair_on, pl.col("side").alias(f"{prefix}_side"),
                                 pl.col("value").alias(f"{prefix}_value"),
                                 *([pl.col(best).cast(pl.String).alias(f"{prefix}_best")] if best else [])))
    pairs = sides[0].join(sides[1], on=pair_on)
    if not len(pairs):
        raise FedsimError(f"claim {claim['claim']!r}: no points of `better` and `than` share a seed and "
                          "the other axes; the study has not run them")
    sign = 1.0 if higher or "within" in claim else -1.0
    pairs = pairs.with_columns(stat=sign * (pl.col("a_value") - pl.col("b_value")),
                               ratio=pl.col("b_value") / pl.col("a_value"))
    group_on = [a for a in pair_on if a != SEED]
    grows = claim.get("grows_as")
    if grows:
        pairs = _growth(pairs, grows, group_on)
        group_on = [a for a in group_on if a not in grows]
    label_on = [*group_on, "a_side", "b_side", *(["a_best", "b_best"] if best and not grows else [])]
    groups = []
    for key, rows in pairs.group_by(label_on, maintain_order=True):
        label = _group_label(dict(zip(label_on, key)), group_on, grows)
        values = rows["stat"].to_list()
        ratios = rows["ratio"].to_list() if claim["metric"] in TIMES and not grows else []
        groups.append(Group(label, values, *_verdict(values, claim.get("within"), claim.get("at_least", 0.0)),
                            ratios=ratios))
    order = {FAILS: 0, UNSURE: 1, HOLDS: 2}
    within = claim.get("within")
    decisive = min(groups, key=lambda g: (order[g.verdict], -abs(g.mean) if within else g.mean))
    return Verdict(claim, groups, decisive.verdict, decisive, unreached)


def _select(points: pl.DataFrame, selection: dict) -> pl.DataFrame:
    for axis, wanted in selection.items():
        points = points.filter(pl.col(axis).is_in(wanted if isinstance(wanted, list) else [wanted]))
    return points


def _label(named: list[str]) -> pl.Expr:
    """What a side is: its algorithm, then its other named axes as key=value."""
    parts = [pl.col(a).cast(pl.String) if a == "algorithm.name"
             else pl.concat_str(pl.lit(a.split(".")[-1] + "="), pl.col(a).cast(pl.String)) for a in named]
    return pl.concat_str(parts, separator=" ")


def _best_of(side: pl.DataFrame, axis: str, pair_on: list[str], higher: bool) -> pl.DataFrame:
    """Each side group at its value of `axis` with the best mean metric over the seeds."""
    keys = ["side", *(a for a in pair_on if a != SEED)]
    means = side.group_by([*keys, axis]).agg(mean=pl.col("value").mean())
    chosen = means.sort("mean", descending=higher).group_by(keys, maintain_order=True).first()
    return side.join(chosen.select(*keys, axis), on=[*keys, axis])


def _growth(pairs: pl.DataFrame, grows: dict, group_on: list[str]) -> pl.DataFrame:
    """Per seed and group: the advantage at the claimed end of the axis minus at the other."""
    (axis, direction), = grows.items()
    values = sorted(pairs[axis].unique().to_list())
    first, last = (values[0], values[-1]) if direction == "falls" else (values[-1], values[0])
    keys = [a for a in pairs.columns if a not in (axis, "a_value", "b_value", "a_best", "b_best", "stat", "ratio")]
    at = [pairs.filter(pl.col(axis) == v).select(*keys, pl.col("stat").alias(f"stat_{i}"))
          for i, v in enumerate((first, last))]
    return at[0].join(at[1], on=keys).with_columns(stat=pl.col("stat_0") - pl.col("stat_1"))


def _group_label(key: dict, group_on: list[str], grows: dict | None) -> str:
    text = f"{key['a_side']} vs {key['b_side']}"
    if "a_best" in key:
        text = f"{key['a_side']} ({key['a_best']}) vs {key['b_side']} ({key['b_best']})"
    where = [f"{a.split('.')[-1]}={key[a]}" for a in group_on]
    if grows:
        (axis, direction), = grows.items()
        text = f"({text}) as {axis.split('.')[-1]} {direction}"
    return text + (f" at {', '.join(where)}" if where else "")


def _verdict(values: list[float], within: float | None, at_least: float = 0.0) -> tuple[str, str]:
    """A group's verdict and, when inconclusive, the note on what would decide it."""
    n, mean = len(values), float(np.mean(values))
    sd = float(np.std(values, ddof=1)) if n > 1 else None
    verdict = decide(mean, ci95([sd], [n])[0], within, at_least)
    return verdict, _more_seeds_note(mean, sd, n, within, at_least) if verdict == UNSURE else ""


def decide(mean: float, half: float | None, within: float | None = None, at_least: float = 0.0) -> str:
    """The verdict of the 95 % CI [mean - half, mean + half]: a mean on the claimed side whose CI
    crosses the boundary proves nothing either way, so only the whole CI decides. `half` None
    (one seed, no CI): inconclusive."""
    if half is None:
        return UNSURE
    low, high = mean - half, mean + half
    if within is not None:
        inside, outside = -within < low and high < within, low >= within or high <= -within
    else:
        inside, outside = low > at_least, high <= at_least
    return HOLDS if inside else FAILS if outside else UNSURE


def _distance(mean: float, within: float | None, at_least: float) -> float:
    """From the mean to the boundary that would decide: the nearest margin edge, or the bar."""
    return abs(abs(mean) - within) if within is not None else abs(mean - at_least)


def seeds_to_decide(mean: float, sd: float, n: int, within: float | None = None,
                    at_least: float = 0.0) -> int | None:
    """About how many more seeds than `n` would decide an inconclusive group, were its mean and
    sd to stay as measured: the fewest n' > n whose CI half-width (Student's t, as ci95) is below
    the distance from the mean to the deciding boundary, minus n. None when more than
    MORE_SEEDS_CAP would be needed (a mean on the boundary: no number of seeds)."""
    counts = np.arange(n + 1, n + MORE_SEEDS_CAP + 1)
    halves = np.array(ci95([sd] * len(counts), counts))
    hit = np.flatnonzero(halves < _distance(mean, within, at_least))
    return int(counts[hit[0]]) - n if hit.size else None


def _more_seeds_note(mean: float, sd: float | None, n: int, within: float | None, at_least: float) -> str:
    if sd is None:
        return "needs 2 or more seeds"
    if _distance(mean, within, at_least) == 0:
        return "the mean is on the boundary: more seeds would not decide it"
    more = seeds_to_decide(mean, sd, n, within, at_least)
    if more is None:
        return f"more than {MORE_SEEDS_CAP} more seeds"
    return "about 1 more seed" if more == 1 else f"about {more} more seeds"


# -- the report ---------------------------------------------------------------------------------

def measured(verdict: Verdict, group: Group | None = None) -> str:
    """`+3.20 ± 1.10 pp` (accuracies in points), `-0.0123 ± 0.004` (losses) or `+3.44min ± 14.0s
    (x1.25 ± 0.08)` (times, each in the unit its size calls for: time saved, and the ratio than /
    better)."""
    group = group or verdict.decisive
    ci = group.ci
    if verdict.claim["metric"] in TIMES:
        ratio = group.ratio
        return ("-+"[group.mean >= 0] + duration(abs(group.mean)) + (f" ± {duration(ci)}" if ci is not None else "")
                + (f" (x{ratio[0]:.2f}" + (f" ± {ratio[1]:.2f})" if ratio[1] is not None else ")")
                   if ratio and np.isfinite(ratio[0]) else ""))
    if verdict.claim["metric"] in ACCURACY_METRICS:
        return f"{100 * group.mean:+.2f}" + (f" ± {100 * ci:.2f}" if ci is not None else "") + " pp"
    return f"{group.mean:+.4g}" + (f" ± {ci:.2g}" if ci is not None else "")


def judge_study(folder: Path, axes: dict[str, list], claims: list[dict], zips: list[list[str]] = (),
                datasets: set[str] = frozenset()) -> list[Verdict]:
    if not claims:
        raise FedsimError(f"{folder}: the study has no claims; add [[claims]] tables to its study file "
                          "(see docs/reproductions.md) and run `fedsim sweep` on it again")
    for k, claim in enumerate(claims):  # a study recorded before this check was made at its sweep
        metric_exists(claim, datasets, f"{folder / 'study.toml'}: claim {k + 1} ({claim['claim']!r})")
    study = pl.read_parquet(folder / "study.parquet")
    initial = {p: initial_evaluation(folder / p, read_manifest(folder / p)) for p in study["point"].unique()}
    return [judge(claim, study, axes, zips, initial) for claim in claims]


def claims_table(verdicts: list[Verdict]) -> str:
    rows = [[v.claim["claim"], measured(v), v.verdict_text, v.decisive.label] for v in verdicts]
    return table_text(["claim", "measured (mean ± 95 % CI)", "verdict", "deciding group"], rows)


def claims_markdown(name: str, verdicts: list[Verdict], plots: list[str]) -> str:
    """claims.md: the table, then each claim's groups, then the plots."""
    lines = [f"# Claims of {name}", "",
             "Each claim is checked per group of points, on a statistic per seed: the advantage of "
             "`better` over `than` (> 0 in the claimed direction; accuracies in points, losses in loss "
             "units). The whole 95 % CI of its mean over the seeds decides, not the mean alone: holds "
             "(the CI lies above the bar, 0 or `at_least`; for `within`, inside (-margin, margin)), "
             "does not hold (the CI lies at or below the bar; for `within`, wholly outside the margin), "
             "inconclusive (the CI straddles the boundary, or one seed gives no CI). An inconclusive "
             "verdict says about how many more seeds would decide it, were the mean and sd to stay as "
             "measured. A claim's verdict is its worst group's.", "",
             "| claim | metric | measured (mean ± 95 % CI) | verdict |", "| --- | --- | --- | --- |"]
    for v in verdicts:
        lines.append(f"| {v.claim['claim']} | {_metric_text(v.claim)} | {measured(v)} ({v.decisive.label}) "
                     f"| {v.verdict_text} |")
    for k, v in enumerate(verdicts, 1):
        lines += ["", f"## {k}. {v.claim['claim']}: {v.verdict_text}", "",
                  f"`{json.dumps({key: v.claim[key] for key in KEYS if key in v.claim and key != 'claim'})}`",
                  "", "| group | seeds | measured | verdict |", "| --- | --- | --- | --- |"]
        lines += [f"| {g.label} | {len(g.values)} | {measured(v, g)} | {g.verdict_text} |"
                  for g in sorted(v.groups, key=lambda g: g.label)]
    lines += ["", *(f"![{Path(p).stem}]({p})" for p in plots)]
    return "\n".join(lines) + "\n"


def _metric_text(claim: dict) -> str:
    text = claim["metric"] + (f" (last {claim['window']} rounds)" if claim["metric"] in WINDOWED else "")
    if claim.get("target") is not None:
        text += f" (target {claim['target']:g})"
    if claim.get("within") is not None:
        text += f", within {claim['within']:g}"
    if claim.get("at_least") is not None:
        text += f", advantage > {claim['at_least']:g}"
    if claim.get("grows_as"):
        (axis, direction), = claim["grows_as"].items()
        text += f", grows as {axis} {direction}"
    if claim.get("best_over"):
        text += f", best {claim['best_over']} each"
    return text


def write_claims(folder: Path, name: str, verdicts: list[Verdict]) -> list[Path]:
    """claims.md and plots/claims.png in the study folder."""
    from fedsim.files import atomic_write
    from fedsim.results.plots import plot_claims

    rows = [{"claim": v.claim["claim"], "mean": v.decisive.mean, "ci": v.decisive.ci or 0.0,
             "verdict": v.verdict, "verdict_text": v.verdict_text, "within": v.claim.get("within"),
             "at_least": v.claim.get("at_least", 0.0),
             "scale": 100.0 if v.claim["metric"] in ACCURACY_METRICS else 1.0} for v in verdicts]
    plot = plot_claims(rows, folder / "plots" / "claims.png", name)
    pictures = [p for p in ("plots/claims.png", "plots/study_accuracy_vs_rounds.png") if (folder / p).exists()]
    markdown = claims_markdown(name, verdicts, pictures)
    atomic_write(folder / "claims.md", lambda tmp: Path(tmp).write_text(markdown))
    return [folder / "claims.md", plot]
