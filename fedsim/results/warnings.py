"""Warnings that catch a run whose results are hard to read or whose clock means little: they
go to the manifest's `warnings` and are printed under the end-of-run table.

* participation: over half of the rounds with fewer than 2 arrivals (synchronous rounds: an
  asynchronous aggregation has its `buffer` arrivals by design, one for FedAsync), or fewer
  than 10 % of the devices that its rounds could reach ever arriving (a million devices and
  300 rounds of 120 invitations reach at most 36,000);
* coverage: the run saw less than 5 % of the span of a recorded (or wall-clock) trace, so its
  availability pattern (days, nights, time zones) never played out;
* never arrived: more than 20 % of the devices invited at least 5 times never arrived, with
  the likely cause (too slow for the deadline, offline before finishing, or left over by
  over-committed rounds);
* static availability: a generated round-indexed trace under model timing whose slot (its
  round_duration) held the whole run;
* no update: every round failed its quorum (`[server] update_frac`).
"""

from __future__ import annotations

import numpy as np

from fedsim.config import invite_budget
from fedsim.files import human_duration

COVERAGE_BELOW = 0.05
NEVER_ARRIVED_ABOVE = 0.2
INVITED_AT_LEAST = 5


def run_warnings(run, status: str, sim_time: float) -> list[str]:
    """`run`: the Experiment; coverage is judged once the run has ended (not while `running`)."""
    server = run.config.server
    per_round = server.buffer if server.mode == "async" else invite_budget(server)
    warnings = participation_warnings(run.recorder, rounds=server.mode == "sync", per_round=per_round) \
        if run.strategy.invites_devices else []
    if status not in ("running", "interrupted") and run.coverage_matters:  # (a stopped run goes on)
        warnings += coverage_warning(sim_time, run.index.horizon)
    if run.config.server.timing == "model":
        warnings += never_arrived_warning(run.recorder.counters, run.typical_task_s(), run.config.server.deadline,
                                          asks_first=run.strategy.asks_candidates)
        if status != "running" and not run.coverage_matters and run.config.trace.source != "always":
            warnings += static_availability_warning(len(run.recorder.rows), sim_time, run.config.server.round_duration)
    warnings += quorum_warning(run.recorder, run.config.server.update_frac)
    return warnings + unused_clients_warning(run.config)


def unused_clients_warning(config) -> list[str]:
    """A Parquet dataset's client column that no partition reads (partition other than natural):
    its clients' rows are pooled and spread anew, which a user who named the column rarely means."""
    data = config.data
    if data.dataset != "parquet" or not data.client_column or (data.partition or "natural") == "natural":
        return []
    where = config.origins.get(("data", "partition"), config.source)
    return [f"[data] client_column = {data.client_column!r} makes no devices under partition = {data.partition!r} "
            f"(set in {where}): the rows of its clients are pooled and spread over {data.clients} devices; set "
            "partition = 'natural' for one device per client"]


STATIC_ROUNDS = 5  # rounds of a run within one slot of a round-indexed trace that make it worth a word


def static_availability_warning(rounds: int, sim_time: float, slot_s: float) -> list[str]:
    """A round-indexed trace under model timing whose whole run fell within one of its slots
    (`[server] round_duration`): every device was online throughout, or never."""
    if rounds < STATIC_ROUNDS or sim_time >= slot_s:
        return []
    return [f"static availability: the run's {rounds} rounds took {human_duration(sim_time)} of simulated time, "
            f"within one {human_duration(slot_s)} round of the generated trace ([server] round_duration), so each "
            f"device was online throughout or never; set round_duration near a round's length "
            f"(about {human_duration(sim_time / rounds)} here), or replay a trace of wall-clock time"]


def quorum_warning(recorder, update_frac: float) -> list[str]:
    """Every round failed its quorum: the model never moved."""
    reasons = [row.get("close_reason") for row in recorder.rows]
    if len(reasons) < 2 or any(reason != "quorum" for reason in reasons):
        return []
    return [f"no update: all {len(reasons)} rounds failed their quorum ([server] update_frac = {update_frac:g}), "
            "so the model never changed; lower update_frac, or raise the deadline or the devices' speeds"]


def participation_warnings(recorder, rounds: bool = True, per_round: int = 0) -> list[str]:
    """Why a run's participation makes its results hard to read: over half of the `rounds`
    (synchronous ones) with fewer than 2 arrivals, or fewer than 10 % of the devices that its
    rounds could reach (`per_round` devices a round; 0: every device) ever arriving."""
    arrived = np.fromiter((row["arrived"] for row in recorder.rows), dtype=np.int64)
    warnings = []
    few = int((arrived < 2).sum())
    if rounds and len(arrived) and few > len(arrived) / 2:
        warnings.append(f"degenerate participation: {few} of {len(arrived)} rounds had fewer than "
                        "2 arrivals (check the trace's availability, the deadline and the device speeds)")
    devices = recorder.counters["arrivals"]
    ever = int((devices > 0).sum())
    reach = min(len(devices), len(arrived) * per_round) if per_round else len(devices)
    if len(arrived) and ever < 0.1 * reach:
        of = (f" (its {len(arrived)} rounds of {per_round} could reach {reach} of them)" if reach < len(devices)
              else "")
        warnings.append(f"degenerate participation: only {ever} of {len(devices)} devices "
                        f"({100 * ever / len(devices):.1f}%) ever arrived{of}")
    return warnings


def coverage_warning(sim_time: float, horizon: float) -> list[str]:
    share = sim_time / horizon if horizon > 0 else 1.0
    if share >= COVERAGE_BELOW:
        return []
    return [f"short clock: the run covered {human_duration(sim_time)} of the trace's {human_duration(horizon)} "
            f"({100 * share:.2g} %), so its availability pattern did not play out; run longer "
            "(run.rounds, run.max_time) or start where it matters ([trace] offset); docs/timing.md"]


def never_arrived_warning(counters: dict, typical_task_s: np.ndarray, deadline: float,
                          asks_first: bool = False) -> list[str]:
    """`typical_task_s`: each device's download + compute + upload of a full task; `asks_first`:
    the selection policy asks candidates a question before it invites (power-of-choice)."""
    invited = counters["invitations"] >= INVITED_AT_LEAST
    never = invited & (counters["arrivals"] == 0)
    if not invited.any() or never.sum() <= NEVER_ARRIVED_ABOVE * invited.sum():
        return []
    late, dropped = int(counters["late"][never].sum()), int(counters["drops"][never].sum())
    surplus = int(counters["surplus"][never].sum())
    task_s = float(np.median(typical_task_s[never]))
    if surplus > max(late, dropped):
        cause = ("mostly surplus: over-committed rounds ([server] overcommit) kept the first arrivals, and these "
                 "devices finished after them each time (the slow tail of the cohort); lower overcommit if the "
                 "slow devices should count")
    elif late >= dropped and task_s > deadline:
        cause = (f"mostly late: too slow for the deadline (their median task takes {human_duration(task_s)}, the "
                 f"deadline is {human_duration(deadline)}); raise [server] deadline or see [devices] in docs/timing.md")
    elif late >= dropped and asks_first:  # a task that fits the deadline, started late: after the question
        cause = (f"mostly late although their median task ({human_duration(task_s)}) fits the deadline "
                 f"({human_duration(deadline)}): their tasks started late, after power-of-choice's question, "
                 "which waits for its slowest candidate; lower [algorithm] candidates or raise [server] deadline")
    elif late >= dropped:
        cause = (f"mostly late although their median task ({human_duration(task_s)}) fits the deadline "
                 f"({human_duration(deadline)}): their tasks had less than the deadline left ([server] deadline_sigma "
                 "draws shorter deadlines, and a device's task varies around its median)")
    else:
        cause = ("mostly dropped: offline before finishing (availability: their online sessions are "
                 "shorter than their tasks)")
    return [f"never arrived: {int(never.sum())} of {int(invited.sum())} devices invited at least "
            f"{INVITED_AT_LEAST} times never arrived ({late} late, {dropped} dropped, {surplus} surplus); {cause}"]
