"""Where a run's simulated time went and who straggled, from its Parquet files (for `fedsim
report`): the phases of the tasks that ran to their end, how the rounds closed, the devices
that were invited often and almost never arrived, and participation by time zone or group.

events.parquet can hold millions of rows: it is scanned lazily, for the columns needed.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fedsim.errors import FedsimError, first_line

PHASES = ("download_s", "compute_s", "upload_s")
RAN_TO_END = ("arrived", "late", "surplus")  # outcomes whose task ran all of its phases
QUESTIONS = ("answered", "unanswered")  # power-of-choice's questions to its candidates: no training task
CLOSE_REASONS = ("all-arrived", "quota", "deadline", "nobody-invited", "max-time", "quorum")
STRAGGLER_INVITED = 5  # invited at least this often,
STRAGGLER_ARRIVED_BELOW = 0.1  # and arrived in fewer than this share of the invitations
ZONE_COLUMNS = ("tz_offset", "group")
DEVICE_LABELS = ("class", "tz_offset", "group", "name")  # shown with a straggler where known


def events_kept(config: dict) -> str:
    """`[run] events` of a run's config.toml: the invitations its events.parquet keeps (runs of
    releases before the key kept all)."""
    return config.get("run", {}).get("events", "all")


def _events(run_dir: Path, kept: str) -> pl.LazyFrame | None:
    """The events log's training tasks, where it holds every invitation: statistics of a log
    that kept only some (`kept`, `[run] events`) would be of those alone."""
    path = Path(run_dir) / "events.parquet"
    if not path.is_file() or kept != "all":
        return None
    return pl.scan_parquet(path).filter(~pl.col("outcome").cast(pl.String).is_in(QUESTIONS))


def collect(frame: pl.LazyFrame, run_dir: Path) -> pl.DataFrame:
    """A query of the events log; a damaged one (or a foreign file) is one line."""
    try:
        return frame.collect()
    except (pl.exceptions.PolarsError, OSError) as err:
        raise FedsimError(f"{Path(run_dir) / 'events.parquet'}: not the events log of a fedsim run ({first_line(err)}); "
                          "the run directory is damaged: resume the run or run it again") from None


def latency(run_dir: Path, kept: str = "all") -> dict | None:
    """Median and p90 (linear) of each phase over the tasks that ran to their end; None without
    an events log, or one that kept only some invitations (`kept`, `[run] events`: the tasks
    that arrived are not in it)."""
    events = _events(run_dir, kept)
    if events is None:
        return None
    ran = events.filter(pl.col("outcome").cast(pl.String).is_in(RAN_TO_END))
    row = ran.select(
        pl.len().alias("tasks"),
        *[pl.col(p).median().alias(f"{p}_median") for p in PHASES],
        *[pl.col(p).quantile(0.9, "linear").alias(f"{p}_p90") for p in PHASES],
    )
    row = collect(row, run_dir).row(0, named=True)
    return {"tasks": row["tasks"],
            **{p: {"median": row[f"{p}_median"], "p90": row[f"{p}_p90"]} for p in PHASES}}


def close_reasons(rounds: pl.DataFrame) -> dict | None:
    """Rounds per `close_reason`: the five reasons in their order (0 where none), then any
    other; None for a run directory written before rounds recorded it."""
    if "close_reason" not in rounds.columns:
        return None
    counts = dict(rounds.group_by("close_reason").len().iter_rows())
    return {**{reason: int(counts.pop(reason, 0)) for reason in CLOSE_REASONS},
            **{str(k): int(v) for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))}}


def wasted_work(run_dir: Path, rounds: pl.DataFrame, devices: pl.DataFrame, kept: str = "all") -> dict | None:
    """Device-seconds of work whose update the model never received (dropped, late, surplus,
    and the arrivals of rounds failed for their quorum; sim/events.py `work_s`): in all, per
    round, as a share of all the work done, and per device class where devices have one. None
    for a run directory written before the events log recorded the work. An events log that
    kept only some invitations (`kept`) lacks the work that arrived: the total and per round
    then come from rounds.parquet's `wasted_s`, the shares are unknown (None)."""
    if kept != "all":
        if "wasted_s" not in rounds.columns:
            return None
        wasted_s = float(rounds["wasted_s"].sum())
        return {"wasted_s": wasted_s, "per_round": wasted_s / max(len(rounds), 1), "share": None, "rows": []}
    events = _events(run_dir, kept)
    if events is None or "work_s" not in collect(events.head(0), run_dir).columns:
        return None
    refused = rounds.filter(pl.col("close_reason") == "quorum")["round"] if "close_reason" in rounds.columns else []
    wasted = (pl.col("outcome").cast(pl.String) != "arrived") | pl.col("round").is_in(list(refused))
    sums = (pl.col("work_s").sum().alias("work_s"),
            pl.col("work_s").filter(wasted).sum().alias("wasted_s"))
    total = collect(events.select(*sums), run_dir).row(0, named=True)
    share = lambda part, whole: part / whole if whole else None  # noqa: E731
    doc = {"wasted_s": total["wasted_s"], "per_round": total["wasted_s"] / max(len(rounds), 1),
           "share": share(total["wasted_s"], total["work_s"]), "rows": []}
    if "class" in devices.columns:
        by_class = (events.join(devices.lazy().select("device_id", "class"), on="device_id", how="left")
                    .group_by("class").agg(*sums).sort("class"))
        doc["rows"] = [{"class": r["class"], "wasted_s": r["wasted_s"], "share": share(r["wasted_s"], r["work_s"])}
                       for r in collect(by_class, run_dir).to_dicts()]
    return doc


def stragglers(run_dir: Path, devices: pl.DataFrame, kept: str = "all", deadline: float | None = None) -> list[dict]:
    """Devices invited at least 5 times that arrived in fewer than 10 % of their invitations,
    most invited first (ties: the lower id), with what is known of them, their median compute
    and whole task (download + compute + upload, as planned at invitation) and the likely cause:
    too slow where their median task is longer than the `deadline` (whatever dropped them first),
    else what most of their invitations came to."""
    frame = devices.filter((pl.col("invitations") >= STRAGGLER_INVITED)
                           & (pl.col("arrivals") < STRAGGLER_ARRIVED_BELOW * pl.col("invitations")))
    events = _events(run_dir, kept)
    if events is not None and frame.height:
        compute = (events.join(frame.lazy().select("device_id"), on="device_id", how="semi")
                   .group_by("device_id").agg(pl.col("compute_s").median().alias("median_compute_s"),
                                              pl.sum_horizontal(PHASES).median().alias("median_task_s"))
)
        frame = frame.join(collect(compute, run_dir), on="device_id", how="left")
    surplus = pl.col("surplus") if "surplus" in frame.columns else pl.lit(0)
    too_slow = pl.lit(False) if deadline is None or "median_task_s" not in frame.columns else \
        pl.col("median_task_s").fill_null(0.0) > deadline
    frame = frame.with_columns(
        pl.when(too_slow | ((pl.col("late") >= pl.col("drops")) & (pl.col("late") >= surplus)))
        .then(pl.lit("slow for the deadline"))
        .when(pl.col("drops") >= surplus).then(pl.lit("offline before finishing"))
        .otherwise(pl.lit("after the quota (surplus)")).alias("cause"))
    labels = [c for c in DEVICE_LABELS if c in frame.columns]
    columns = ["device_id", "invitations", "arrivals", "late", pl.col("drops").alias("dropped"),
               *[c for c in ("median_compute_s", "median_task_s") if c in frame.columns], *labels, "cause"]
    rows = frame.sort(["invitations", "device_id"], descending=[True, False]).select(columns).to_dicts()
    for row in rows:
        row.setdefault("median_compute_s", None)
        row.setdefault("median_task_s", None)
        for label in ("class", "tz_offset"):
            row.setdefault(label, None)
    return rows


def participation_by(devices: pl.DataFrame) -> dict | None:
    """Per time zone (or group, where there is no time zone): devices, invitations, the share
    of them that arrived, mean arrivals per device; None where devices.parquet has neither."""
    column = next((c for c in ZONE_COLUMNS if c in devices.columns), None)
    if column is None:
        return None
    rows = (devices.group_by(column)
            .agg(pl.len().alias("devices"), pl.col("invitations").sum(), pl.col("arrivals").sum(),
                 pl.col("arrivals").mean().alias("mean_arrivals"))
            .with_columns(pl.when(pl.col("invitations") > 0)
                          .then(pl.col("arrivals") / pl.col("invitations")).alias("arrival_rate"))
            .sort(column).rename({column: "zone"}))
    return {"column": column, "rows": rows.select("zone", "devices", "invitations", "arrivals",
                                                  "arrival_rate", "mean_arrivals").to_dicts()}
