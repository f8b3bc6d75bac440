"""Claims (fedsim/results/claims.py) checked on hand-made study tables with known verdicts,
and every malformed claim as one error line."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest

from fedsim.cli import main
from fedsim.config import dump_toml
from fedsim.errors import FedsimError
from fedsim.results.claims import (FAILS, HOLDS, UNSURE, check_claims, decide, judge, measured, point_metric,
                                   seeds_to_decide)

ROUNDS = 10


def study(points: list[tuple[dict, list, list | None]]) -> pl.DataFrame:
    """study.parquet as `fedsim sweep` writes it: one row per round of every point, with the
    point's axis values; `acc` and `loss` per round (None: not evaluated), or one number for
    every round."""
    frames = []
    for k, (values, acc, loss) in enumerate(points):
        n = len(acc) if isinstance(acc, list) else ROUNDS
        acc = acc if isinstance(acc, list) else [acc] * n
        loss = loss if isinstance(loss, list) else [1.0 - a if a is not None else None for a in acc] \
            if loss is None else [loss] * n
        frames.append(pl.DataFrame({"round": list(range(n)), "test_acc": acc, "test_loss": loss},
                                   schema={"round": pl.Int64, "test_acc": pl.Float64, "test_loss": pl.Float64})
                      .with_columns(point=pl.lit(f"p{k}"), **{a: pl.lit(v) for a, v in values.items()}))
    return pl.concat(frames)


def two_algorithms(a: list[float], b: list[float], **extra) -> pl.DataFrame:
    """Final accuracies per seed of algorithms "a" and "b"."""
    return study([({"algorithm.name": name, **extra, "run.seed": s}, acc, None)
                  for name, accs in (("a", a), ("b", b)) for s, acc in enumerate(accs)])


AXES = {"algorithm.name": ["a", "b"], "run.seed": [0, 1, 2]}
A_BEATS_B = {"claim": "a beats b", "metric": "final_acc", "better": {"algorithm.name": "a"},
             "than": {"algorithm.name": "b"}}


@pytest.mark.parametrize("a, b, verdict", [
    ([0.80, 0.81, 0.82], [0.70, 0.70, 0.71], HOLDS),
    ([0.70, 0.72, 0.71], [0.80, 0.81, 0.82], FAILS),
    ([0.75, 0.70, 0.76], [0.70, 0.71, 0.70], UNSURE),  # differences 0.05, -0.01, 0.06
    ([0.65, 0.71, 0.64], [0.70, 0.70, 0.70], UNSURE),  # mean -0.033 below 0, but its CI is not
])
def test_better_than_is_decided_by_the_paired_differences_and_their_ci(a, b, verdict):
    result = judge(A_BEATS_B, two_algorithms(a, b), AXES)
    assert result.verdict == verdict
    diffs = np.subtract(a, b)
    assert result.decisive.mean == pytest.approx(diffs.mean())
    assert result.decisive.ci == pytest.approx(4.303 * diffs.std(ddof=1) / math.sqrt(3))
    assert result.decisive.label == "a vs b"
    assert measured(result).endswith(" pp") and measured(result).startswith(("+", "-"))


def test_for_a_loss_lower_is_better():
    frame = study([({"algorithm.name": name, "run.seed": s}, 0.5, loss)
                   for name, loss in (("a", 0.3), ("b", 0.4)) for s in range(3)])
    frame = frame.with_columns(test_loss=pl.col("test_loss") + pl.col("run.seed") * 0.001)
    claim = {**A_BEATS_B, "metric": "final_loss"}
    result = judge(claim, frame, AXES)
    assert result.verdict == HOLDS and result.decisive.mean == pytest.approx(0.1)
    assert judge({**claim, "better": {"algorithm.name": "b"}, "than": {"algorithm.name": "a"}},
                 frame, AXES).verdict == FAILS


def test_every_group_must_hold_and_the_worst_one_decides():
    frame = pl.concat([two_algorithms([0.8, 0.81, 0.82], [0.7, 0.7, 0.7], **{"trace.dynamics": "sine"}),
                       two_algorithms([0.6, 0.61, 0.6], [0.7, 0.7, 0.7], **{"trace.dynamics": "staircase"})
                       .with_columns(point=pl.col("point") + "x")])
    axes = {"algorithm.name": ["a", "b"], "trace.dynamics": ["sine", "staircase"], "run.seed": [0, 1, 2]}
    result = judge(A_BEATS_B, frame, axes)
    assert [g.verdict for g in result.groups] == [HOLDS, FAILS]
    assert result.verdict == FAILS and result.decisive.label == "a vs b at dynamics=staircase"
    only_sine = judge({**A_BEATS_B, "where": {"trace.dynamics": "sine"}}, frame, axes)
    assert only_sine.verdict == HOLDS and len(only_sine.groups) == 1


def test_a_list_of_algorithms_is_every_pair():
    frame = study([({"algorithm.name": name, "run.seed": s}, acc + 0.01 * s, None)
                   for name, acc in (("a", 0.9), ("b", 0.5), ("c", 0.6)) for s in range(3)])
    axes = {"algorithm.name": ["a", "b", "c"], "run.seed": [0, 1, 2]}
    result = judge({**A_BEATS_B, "than": {"algorithm.name": ["b", "c"]}}, frame, axes)
    assert sorted(g.label for g in result.groups) == ["a vs b", "a vs c"]
    assert result.verdict == HOLDS and result.decisive.mean == pytest.approx(0.3)


def gap_study(gaps: dict[float, list[float]]) -> pl.DataFrame:
    """a - b = gaps[p_min][seed] at each p_min."""
    return study([({"algorithm.name": name, "trace.p_min": p, "run.seed": s},
                   0.5 + (gap if name == "a" else 0.0), None)
                  for p, per_seed in gaps.items() for s, gap in enumerate(per_seed) for name in ("a", "b")])


P_AXES = {"algorithm.name": ["a", "b"], "trace.p_min": [0.5, 0.2, 0.05], "run.seed": [0, 1, 2]}


def test_grows_as_compares_the_advantage_at_the_two_ends_of_the_axis():
    claim = {**A_BEATS_B, "grows_as": {"trace.p_min": "falls"}}
    growing = gap_study({0.5: [0.0, 0.01, 0.0], 0.2: [0.02, 0.03, 0.02], 0.05: [0.08, 0.09, 0.1]})
    result = judge(claim, growing, P_AXES)
    assert result.verdict == HOLDS and result.decisive.mean == pytest.approx(np.mean([0.08, 0.08, 0.1]))
    assert result.decisive.label == "(a vs b) as p_min falls"
    assert judge({**claim, "grows_as": {"trace.p_min": "rises"}}, growing, P_AXES).verdict == FAILS


def test_within_is_an_equivalence_with_a_margin():
    claim = {**A_BEATS_B, "within": 0.01}
    close = judge(claim, two_algorithms([0.801, 0.798, 0.8015], [0.8, 0.8, 0.8]), AXES)
    assert close.verdict == HOLDS
    apart = judge(claim, two_algorithms([0.83, 0.83, 0.831], [0.8, 0.8, 0.8]), AXES)
    assert apart.verdict == FAILS and apart.decisive.mean == pytest.approx(0.03033, abs=1e-4)
    noisy = judge(claim, two_algorithms([0.805, 0.79, 0.812], [0.8, 0.8, 0.8]), AXES)
    assert noisy.verdict == UNSURE


def test_best_over_takes_each_side_at_its_best_learning_rate():
    accs = {("a", 0.1): 0.5, ("a", 0.01): 0.9, ("b", 0.1): 0.8, ("b", 0.01): 0.6}
    frame = study([({"algorithm.name": name, "client.lr": lr, "run.seed": s}, acc + 0.001 * s, None)
                   for (name, lr), acc in accs.items() for s in range(3)])
    axes = {"algorithm.name": ["a", "b"], "client.lr": [0.1, 0.01], "run.seed": [0, 1, 2]}
    result = judge({**A_BEATS_B, "best_over": "client.lr"}, frame, axes)
    assert result.verdict == HOLDS and result.decisive.mean == pytest.approx(0.1)
    assert result.decisive.label == "a (0.01) vs b (0.1)"


def test_windowed_metrics_read_the_last_rounds_of_the_study():
    swinging = [0.5, 0.6] * 5
    frame = study([({"algorithm.name": "a", "run.seed": 0}, [0.7] * 10, [0.4] * 10),
                   ({"algorithm.name": "b", "run.seed": 0}, [0.1] * 6 + [0.9] * 4, swinging),
                   ({"algorithm.name": "c", "run.seed": 0}, [0.9] * 7, None)])  # stopped early
    tail = dict(point_metric(frame, "tail_acc", 4).iter_rows())
    assert tail == {"p0": pytest.approx(0.7), "p1": pytest.approx(0.9)}  # c has no last rounds
    swing = dict(point_metric(frame, "loss_swing", 4).iter_rows())
    assert swing["p0"] == 0.0 and swing["p1"] == pytest.approx(0.1)
    evaluated = study([({"algorithm.name": "a", "run.seed": 0}, [None, 0.2, None, 0.4, None], None)])
    assert dict(point_metric(evaluated, "final_acc").iter_rows())["p0"] == 0.4
    assert dict(point_metric(evaluated, "tail_acc", 3).iter_rows())["p0"] == 0.4


def timed(points: list[tuple[dict, list, list]]) -> pl.DataFrame:
    """A study.parquet of evaluated rounds: test accuracy (None: not evaluated) and t_end."""
    return pl.concat([pl.DataFrame({"round": range(len(acc)), "test_acc": acc, "t_end": t_end},
                                   schema={"round": pl.Int64, "test_acc": pl.Float64, "t_end": pl.Float64})
                      .with_columns(test_loss=pl.lit(0.0), duration=pl.lit(1.0), point=pl.lit(f"p{k}"),
                                    **{a: pl.lit(v) for a, v in values.items()})
                      for k, (values, acc, t_end) in enumerate(points)])


def test_time_to_accuracy_is_the_reports_time_to_target():
    """As `fedsim report` tells it: an evaluation holds until the next round ends, then linear to
    the first evaluation at or above the target; from the initial evaluation where there is one."""
    frame = timed([({"algorithm.name": "a", "run.seed": 0}, [None, 0.5, None, 0.72, 0.69, 0.8], [5, 9, 20, 31, 40, 52]),
                   ({"algorithm.name": "a", "run.seed": 1}, [0.1, float("nan"), 0.7], [3, 6, 9]),
                   ({"algorithm.name": "b", "run.seed": 0}, [0.3, 0.6, 0.65], [10, 20, 30])])
    times = dict(point_metric(frame, "time_to_acc", target=0.7).iter_rows())
    # p0: 0.5 (t 9) holds to t 20, 0.72 at t 31: 20 + 11 * 0.2 / 0.22; p1: exactly at 9; p2 never reached 0.7
    assert times == pytest.approx({"p0": 30.0, "p1": 9.0, "p2": None})
    assert dict(point_metric(frame, "time_to_acc", target=0.5).iter_rows()) == pytest.approx(
        {"p0": 9.0, "p1": 6.0 + 3.0 * 0.4 / 0.6, "p2": 20.0})
    initial = {"p0": {"test_acc": 0.2, "test_loss": 2.0, "t": 0.0}}  # 0.2 holds until round 1 ends (t 5)
    with_initial = dict(point_metric(frame, "time_to_acc", target=0.4, initial=initial).iter_rows())
    assert with_initial["p0"] == pytest.approx(5.0 + (9.0 - 5.0) * 0.2 / 0.3)


def test_a_time_claim_gives_the_seconds_saved_and_the_ratio_with_their_cis():
    """Async reaches 0.7 at 100, 120, 110 s, sync at 300, 330, 320 s; sync's seed 3 never does."""
    fast, slow = [100.0, 120.0, 110.0, 90.0], [300.0, 330.0, 320.0, None]
    frame = timed([({"algorithm.name": name, "run.seed": s}, [0.5, 0.7 if t else 0.6], [t or 50.0, t or 400.0])
                   for name, ts in (("a", fast), ("b", slow)) for s, t in enumerate(ts)])
    claim = {"claim": "a is faster", "metric": "time_to_acc", "target": 0.7, "better": {"algorithm.name": "a"},
             "than": {"algorithm.name": "b"}}
    check_claims([claim], {**AXES, "run.seed": [0, 1, 2, 3]}, "s.toml")
    result = judge(claim, frame, {**AXES, "run.seed": [0, 1, 2, 3]})
    assert result.decisive.values == [200.0, 210.0, 210.0]  # seconds saved, seed 3 left out
    ratios = [3.0, 2.75, 320 / 110]
    assert result.decisive.ratios == pytest.approx(ratios)
    half = 4.302653 * np.std(ratios, ddof=1) / math.sqrt(3)  # Student's t, 2 degrees of freedom
    assert result.decisive.ratio == pytest.approx((np.mean(ratios), half), rel=1e-3)
    assert result.verdict == HOLDS and result.unreached == 1
    assert result.verdict_text == "holds; 1 point never reached the target, left out"
    saved = np.std([200.0, 210.0, 210.0], ddof=1) * 4.302653 / math.sqrt(3)
    assert f"{saved:.3g}" == "14.3"
    assert measured(result) == f"+3.44min ± 14.3s (x{np.mean(ratios):.2f} ± {half:.2f})"  # 206.7 s saved
    with pytest.raises(FedsimError, match=r"^claim 'a is faster': no point of the study reached test accuracy 0.9 "
                                          r"\(metric 'time_to_acc'\); lower the claim's target or run the study longer$"):
        judge({**claim, "target": 0.9}, frame, {**AXES, "run.seed": [0, 1, 2, 3]})


@pytest.mark.parametrize("change, says", [
    ({"metric": "final_accuracy"}, "metric = 'final_accuracy' is unknown; did you mean 'final_acc'?"),
    ({"metric": "tail_acc"}, "metric 'tail_acc' needs window = ROUNDS"),
    ({"better": {"algorithm.nam": "a"}}, "better names 'algorithm.nam', which is not an axis of the study"),
    ({"than": {"algorithm.name": "z"}}, "than algorithm.name = 'z' is not a value of that axis"),
    ({"better": {}}, "better and than must each select points"),
    ({"grows_as": {"algorithm.name": "up"}}, "grows_as 'algorithm.name' = 'up' must be \"falls\" or \"rises\""),
    ({"within": -1}, "within = -1 must be a margin > 0"),
    ({"best_over": "client.lr"}, "best_over = 'client.lr' is not an axis of the study"),
    ({"treshold": 1}, "unknown key 'treshold'"),
    ({"claim": ""}, "claim = '' must be the sentence the report shows"),
    ({"metric": "time_to_acc"}, "metric 'time_to_acc' needs target = ACCURACY (a number in (0, 1], 0.7 = 70 %), "
                                "got None"),
    ({"metric": "time_to_acc", "target": 70}, "needs target = ACCURACY (a number in (0, 1], 0.7 = 70 %), got 70"),
    ({"target": 0.7}, "target applies to metric 'time_to_acc', not 'final_acc'; remove it"),
])
def test_a_malformed_claim_is_one_line_naming_it(change, says):
    with pytest.raises(FedsimError) as err:
        check_claims([A_BEATS_B, {**A_BEATS_B, **change}], AXES, "study.toml")
    assert says in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("study.toml: claim 2")


def test_an_axis_zipped_with_a_named_one_goes_with_it():
    """A learning rate per algorithm (zip): a at 0.1 against b at 0.05, paired by seed."""
    frame = study([({"algorithm.name": name, "client.lr": lr, "run.seed": s}, acc + 0.01 * s, None)
                   for name, lr, acc in (("a", 0.1, 0.8), ("b", 0.05, 0.7)) for s in range(3)])
    axes = {"algorithm.name": ["a", "b"], "client.lr": [0.1, 0.05], "run.seed": [0, 1, 2]}
    result = judge(A_BEATS_B, frame, axes, [["algorithm.name", "client.lr"]])
    assert result.verdict == HOLDS and result.decisive.mean == pytest.approx(0.1)
    assert result.decisive.label == "a vs b"
    with pytest.raises(FedsimError, match="no points of `better` and `than` share a seed"):
        judge(A_BEATS_B, frame, axes)


def test_at_least_moves_the_bar_a_non_inferiority_claim_must_clear():
    """a is 0.5 point below b: it fails "a beats b" but holds "a is at most 1 point below b"."""
    frame = two_algorithms([0.795, 0.7945, 0.7952], [0.8, 0.8, 0.8])
    assert judge(A_BEATS_B, frame, AXES).verdict == FAILS
    result = judge({**A_BEATS_B, "at_least": -0.01}, frame, AXES)
    assert result.verdict == HOLDS and result.decisive.mean == pytest.approx(-0.0051, abs=1e-4)
    assert judge({**A_BEATS_B, "at_least": -0.005}, frame, AXES).verdict == UNSURE  # CI -0.60 .. -0.42 pp
    assert judge({**A_BEATS_B, "at_least": -0.004}, frame, AXES).verdict == FAILS
    with pytest.raises(FedsimError, match="within is a claim of its own"):
        check_claims([{**A_BEATS_B, "at_least": -0.01, "within": 0.01}], AXES, "s")


# -- the rule: the whole 95 % CI decides ------------------------------------------------------

@pytest.mark.parametrize("mean, half, verdict", [
    (0.0129, 0.0136, UNSURE),  # paper-mifa: +1.29 ± 1.36 pp, CI -0.07 .. 2.65 against a 1 pp margin
    (0.002, 0.005, HOLDS),  # CI -0.3 .. 0.7 pp: inside (-1, 1)
    (0.009, 0.002, UNSURE),  # 0.7 .. 1.1 pp: crosses the edge
    (0.03, 0.01, FAILS),  # 2 .. 4 pp: wholly outside
    (-0.03, 0.01, FAILS),  # -4 .. -2 pp: wholly outside, below
    (-0.012, 0.001, FAILS),
    (0.0, 0.02, UNSURE),  # wider than the margin
])
def test_a_within_claim_holds_inside_the_margin_fails_wholly_outside_it(mean, half, verdict):
    assert decide(mean, half, within=0.01) == verdict


def test_the_edges_of_the_margin_and_the_bar_are_exact():
    """Binary fractions, so that the CI's ends fall on the boundaries exactly."""
    assert decide(0.75, 0.25, within=0.5) == FAILS  # CI [0.5, 1]: outside (-0.5, 0.5)
    assert decide(0.25, 0.25, within=0.5) == UNSURE  # CI [0, 0.5]: not inside the open margin
    assert decide(-0.25, 0.25) == FAILS  # CI [-0.5, 0]: at or below the bar 0
    assert decide(0.25, 0.25) == UNSURE  # CI [0, 0.5]: not above it


@pytest.mark.parametrize("mean, half, at_least, verdict", [
    (0.02, 0.01, 0.0, HOLDS),  # CI 1 .. 3 pp above 0
    (-0.02, 0.01, 0.0, FAILS),  # CI -3 .. -1 pp, wholly below 0
    (0.005, 0.01, 0.0, UNSURE),  # straddles 0 with the mean above
    (-0.005, 0.01, 0.0, UNSURE),  # straddles 0 with the mean below (the old rule said: does not hold)
    (-0.005, 0.004, -0.01, HOLDS),  # at most 1 point worse: CI -0.9 .. -0.1 pp above -1
    (-0.02, 0.005, -0.01, FAILS),
    (-0.008, 0.004, -0.01, UNSURE),
])
def test_a_better_or_at_least_claim_holds_above_the_bar_fails_wholly_below_it(mean, half, at_least, verdict):
    assert decide(mean, half, at_least=at_least) == verdict


def test_one_seed_has_no_ci_and_decides_nothing():
    assert decide(0.5, None) == decide(-0.5, None) == decide(0.0, None, within=0.01) == UNSURE
    frame = two_algorithms([0.9], [0.1])
    result = judge(A_BEATS_B, frame, {"algorithm.name": ["a", "b"], "run.seed": [0]})
    assert result.verdict == UNSURE and result.verdict_text == "inconclusive (needs 2 or more seeds)"
    assert measured(result) == "+80.00 pp"


def test_how_many_more_seeds_would_decide_by_hand():
    """The fewest n' > n with t(0.975, n' - 1) * s / sqrt(n') below the distance to the deciding boundary."""
    # paper-mifa's within claim: +1.29 ± 1.36 pp over 3 seeds, so s = 1.36 * sqrt(3) / 4.303 = 0.547 pp;
    # it would not hold once the CI is above the 1 pp edge, 0.29 pp from the mean:
    # n' = 16: 2.131 * 0.547 / 4 = 0.292 > 0.29; n' = 17: 2.120 * 0.547 / sqrt(17) = 0.281 < 0.29
    s = 0.0136 * math.sqrt(3) / 4.303
    assert 2.131 * s / 4 > 0.0029 > 2.120 * s / math.sqrt(17)
    assert seeds_to_decide(0.0129, s, 3, within=0.01) == 14
    # a better claim +1.87 ± 3.06 pp over 3 seeds (paper-fedawe): s = 1.232 pp, the bar 0 is 1.87 pp off;
    # n' = 4: 3.182 * 1.232 / 2 = 1.96 > 1.87; n' = 5: 2.776 * 1.232 / sqrt(5) = 1.53 < 1.87
    assert seeds_to_decide(0.0187, 0.0306 * math.sqrt(3) / 4.303, 3) == 2
    # beyond 30 degrees of freedom Student's t still: t(0.975, 385) / sqrt(386) = 1.96613 / 19.647 = 0.10007 > 0.1,
    # t(0.975, 386) / sqrt(387) = 1.96611 / 19.672 = 0.09994 < 0.1: n' = 387 (with 1.96 it said 385)
    assert seeds_to_decide(0.1, 1.0, 3) == 384
    assert seeds_to_decide(1e-6, 1.0, 3) is None  # more than 1000 more


def paper_mifa_frame() -> pl.DataFrame:
    """a - b = +1.29 ± 1.36 pp over 3 seeds: mean 1.29 pp, sd s = 1.36 * sqrt(3) / 4.303 pp."""
    s = 0.0136 * math.sqrt(3) / 4.303
    return two_algorithms([0.8 + 0.0129 + s * k for k in (-1, 0, 1)], [0.8] * 3)


def test_the_paper_mifa_case_is_inconclusive_and_says_how_many_seeds_would_decide():
    result = judge({**A_BEATS_B, "within": 0.01}, paper_mifa_frame(), AXES)
    assert measured(result) == "+1.29 ± 1.36 pp"
    assert result.verdict == UNSURE and result.verdict_text == "inconclusive (about 14 more seeds)"
    near = two_algorithms([0.75, 0.25, 0.5], [0.5] * 3)  # differences 0.25, -0.25, 0: mean exactly 0
    assert judge(A_BEATS_B, near, AXES).decisive.note == "the mean is on the boundary: more seeds would not decide it"
    far = two_algorithms([0.75, 0.25, 0.5 + 2 ** -20], [0.5] * 3)
    assert judge(A_BEATS_B, far, AXES).decisive.note == "more than 1000 more seeds"


def test_fedsim_report_claims_prints_the_verdicts_of_a_tiny_study(tmp_path, capsys):
    """A real sweep (2 algorithms x 3 seeds), its study.parquet then given known accuracies
    (mifa - fedavg = +1.29 ± 1.36 pp) so that the printed verdicts are known."""
    claims = [{"claim": "mifa matches fedavg within 1 point", "within": 0.01},
              {"claim": "mifa beats fedavg"},
              {"claim": "mifa beats fedavg by 3 points", "at_least": 0.03},
              {"claim": "mifa is at most 2 points below fedavg", "at_least": -0.02}]
    study = {"run": {"rounds": 4, "eval_every": 2, "progress": False, "plots": False, "name": "s",
                     "out": str(tmp_path / "runs")},
             "data": {"dataset": "digits", "clients": 10}, "server": {"clients_per_round": 5, "timing": "ideal"},
             "client": {"local_steps": 1}, "sweep": {"algorithm.name": ["fedavg", "mifa"], "run.seed": [0, 1, 2]},
             "claims": [{**c, "metric": "final_acc", "better": {"algorithm.name": "mifa"},
                         "than": {"algorithm.name": "fedavg"}} for c in claims]}
    (tmp_path / "s.toml").write_text(dump_toml(study))
    assert main(["sweep", str(tmp_path / "s.toml"), "--quiet"]) == 0
    folder = tmp_path / "runs" / "s"
    frame = pl.read_parquet(folder / "study.parquet")
    known = paper_mifa_frame().filter(pl.col("round") == 0).select(
        pl.col("algorithm.name").replace({"a": "mifa", "b": "fedavg"}),
        pl.col("run.seed").cast(frame["run.seed"].dtype), pl.col("test_acc").alias("acc"))
    frame = frame.join(known, on=["algorithm.name", "run.seed"]).with_columns(test_acc=pl.col("acc")).drop("acc")
    frame.write_parquet(folder / "study.parquet")
    capsys.readouterr()
    assert main(["report", str(folder), "--claims"]) == 0
    rows = {line.split("  ")[0]: line for line in capsys.readouterr().out.splitlines()}
    expected = ["inconclusive (about 14 more seeds)", "inconclusive (about 1 more seed)", "does not hold", "holds"]
    for claim, verdict in zip(claims, expected):
        row = rows[claim["claim"]]
        assert "+1.29 ± 1.36 pp" in row and f"  {verdict}  " in row, row
    markdown = (folder / "claims.md").read_text()
    assert "| inconclusive (about 14 more seeds) |" in markdown
    assert "## 1. mifa matches fedavg within 1 point: inconclusive (about 14 more seeds)" in markdown
    assert main(["report", str(folder), "--claims", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(c["verdict"], c["note"]) for c in doc] == [
        (UNSURE, "about 14 more seeds"), (UNSURE, "about 1 more seed"), (FAILS, None), (HOLDS, None)]


def test_a_metric_no_point_recorded_is_named_not_blamed_on_missing_points():
    nan = float("nan")
    with pytest.raises(FedsimError, match=r"^claim 'a beats b': metric 'final_acc' has no value in any point of the "
                                          r"study \(no run recorded a finite test accuracy at the last evaluation\)"):
        judge(A_BEATS_B, two_algorithms([nan] * 3, [nan] * 3), AXES)


def test_an_accuracy_claim_on_the_quadratic_task_is_refused_for_its_metric():
    with pytest.raises(FedsimError, match=r"does not exist for the quadratic task, .* use one it has: final_loss, "
                                          "tail_loss, loss_swing, round_s, sim_time$"):
        check_claims([A_BEATS_B], AXES, "s.toml", {"quadratic"})
    assert check_claims([A_BEATS_B], AXES, "s.toml", {"quadratic", "digits"})  # some points have an accuracy
    assert check_claims([{**A_BEATS_B, "metric": "final_loss"}], AXES, "s.toml", {"quadratic"})
