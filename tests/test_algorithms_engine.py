"""ALGORITHMS.md §4 through the whole engine: config -> `fedsim run` -> run directory.

Quadratic task f_i(x) = ½‖x − u_i‖², exact gradients (batch_size = 0), ideal timing with
round_duration = 1, so round r sees the trace at t = r. Tolerances come from the math of each
check (contraction rates, stationary variances, standard errors); float32 rounding of the
engine contributes ~1e-6.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import reference_algorithms as ref  # noqa: E402
from conftest import alternating_trace, final_x, quadratic_config, rounds  # noqa: E402

from fedsim.algorithms import REGISTRY  # noqa: E402
from fedsim.traces import AvailabilityIndex, Trace, generate, known_probability  # noqa: E402

E1, E2 = [1.0, 0.0], [0.0, 1.0]
FLOAT32 = 2e-6  # rounding of the engine's float32 arithmetic over these short runs


def qconfig(targets, options=None, **kwargs) -> dict:
    """``quadratic_config`` plus ``[algorithm]`` keys (``run.algorithms`` when given a list)."""
    algorithms = kwargs.pop("algorithms", None)
    config = quadratic_config(targets, **kwargs)
    config["algorithm"].update(options or {})
    if algorithms:
        config["run"]["algorithms"] = algorithms
    return config


def availability(trace: Trace, rounds_: int) -> np.ndarray:
    """[R, N] bool: who the engine sees online in each round (ideal timing, D = 1)."""
    index = AvailabilityIndex(trace)
    return np.stack([index.online(float(r)) for r in range(rounds_)])


def one_per_round_trace(n: int, who: np.ndarray) -> Trace:
    """Device who[r] online in round r (-1: nobody)."""
    r = np.flatnonzero(who >= 0)
    return Trace.from_intervals(who[r], r.astype(float), r + 1.0, n_devices=n, horizon=float(len(who)))


# --- every algorithm against its numpy reference ---------------------------------------------

N, D, R = 5, 3, 40
P_DEVICES = [0.9, 0.7, 0.5, 0.3, 0.15]


@pytest.fixture(scope="module")
def random_case(tmp_path_factory):
    """A Bernoulli trace (written to a file: it keeps the p_i^t that fedavg-known-p needs)."""
    trace = generate("bernoulli", N, seed=11, rounds=R, round_duration=1.0, p=P_DEVICES)
    rng = np.random.default_rng(5)
    targets = (rng.normal(size=(N, D)) * 2).round(3).tolist()
    x0 = rng.normal(size=D).round(3).tolist()
    avail = availability(trace, R)
    assert not avail.all(1).any() and avail.any(1).all() is not None
    return trace, np.asarray(targets), x0, avail, known_probability(trace, np.arange(R))


def reference_run(cli_run, random_case, algorithms, name, options=None, **sections):
    trace, U, x0, _, _ = random_case
    config = qconfig(U.tolist(), {"server_lr": 0.8, **(options or {})}, lr=0.2, steps=2, rounds=R,
                     model={"init": x0}, algorithms=algorithms, **sections)
    run_dir = cli_run(config, trace, name=name)
    return {a: final_x(run_dir / a) for a in algorithms}


def test_every_algorithm_matches_its_numpy_reference(cli_run, random_case):
    _, U, x0, A, P = random_case
    lr = lambda t: 0.2  # noqa: E731
    expected = {
        "fedavg": ref.fedavg(U, A, x0, lr, 2, 0.8),
        "fedavg-all": ref.fedavg_all(U, A, x0, lr, 2, 0.8),
        "fedavg-known-p": ref.fedavg_known_p(U, A, x0, lr, 2, P, 0.8),
        "fedbuff": ref.fedavg(U, A, x0, lr, 2, 0.8),  # synchronous rounds: staleness 0
        "fedsgd": ref.fedavg(U, A, x0, lr, 1, 0.8),
        "fedprox": ref.fedavg(U, A, x0, lr, 2, 0.8, mu=0.5),
        "fedavg-wait": ref.fedavg_wait(U, A, x0, lr, 2, lambda t: range(N), 0.8),
        "mifa": ref.mifa(U, A, x0, lr, 2, False, 0.8),
        "fedawe": ref.fedawe(U, A, x0, lr, 2, 0.0, 0.8),
        "amplified": ref.amplified(U, A, x0, lr, 2, 7, 3.0, 0.8),
        "fedau": ref.fedau(U, A, x0, lr, 2, 4, 0.8),
        "fedvarp": ref.fedvarp(U, A, x0, lr, 2, 0.8),
        "sequential-sgd": ref.sequential_sgd(U, A, x0, lr, 2, 0.8),
        "fednova": ref.fednova(U, A, x0, lr, [2] * N, 0.8),  # equal steps (unequal: tests/test_partial_work.py)
        "scaffold": ref.scaffold(U, A, x0, lr, 2, 0.8),
        "feddyn": ref.feddyn(U, A, x0, lr, 2, 0.3, 0.8),
    }
    got = reference_run(cli_run, random_case, list(expected), "refs",
                        {"selection": "all", "mu": 0.5, "S": N, "period": 7, "eta": 3.0, "cutoff": 4, "alpha": 0.3})
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)
        assert not np.allclose(expected[name], x0, atol=1e-3), name


def test_selecting_and_warming_up_variants_match_their_references(cli_run, random_case):
    """FedLaAvg's own longest-absent selection; MIFA's warm-up with lr/t over update rounds;
    FedAWE's clipping of the echoed update."""
    _, U, x0, A, _ = random_case
    lr = lambda t: 0.2  # noqa: E731
    got = reference_run(cli_run, random_case, ["fedlaavg"], "laavg", {"beta": 0.4})
    np.testing.assert_allclose(got["fedlaavg"], ref.fedlaavg(U, A, x0, lr, 2, 0.4, 0.8), rtol=1e-4, atol=1e-5)
    got = reference_run(cli_run, random_case, ["mifa"], "warm", {"warmup": True},
                        client={"lr": 0.3, "lr_schedule": "inverse"})
    expected = ref.mifa(U, A, x0, lambda t: 0.3 / t, 2, True, 0.8)
    np.testing.assert_allclose(got["mifa"], expected, rtol=1e-4, atol=1e-5)
    got = reference_run(cli_run, random_case, ["fedawe"], "clip", {"clip": 0.05})
    np.testing.assert_allclose(got["fedawe"], ref.fedawe(U, A, x0, lr, 2, 0.05, 0.8), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options", [
    {"server_optimizer": "momentum", "server_momentum": 0.7, "server_lr": 0.5},
    {"server_optimizer": "adam", "server_beta1": 0.8, "server_beta2": 0.95, "server_eps": 0.05,
     "server_lr": 0.1},
    {"server_optimizer": "adagrad", "server_beta1": 0.8, "server_eps": 0.05, "server_lr": 0.1},
    {"server_optimizer": "yogi", "server_beta1": 0.8, "server_beta2": 0.95, "server_eps": 0.05,
     "server_lr": 0.1},
])
def test_server_optimizers_match_their_numpy_references(cli_run, random_case, options):
    """FedAvgM, FedAdam, FedAdagrad and FedYogi (fedavg + momentum / adam / adagrad / yogi), and
    FedVARP with the same optimizer."""
    _, U, x0, A, _ = random_case
    lr = lambda t: 0.2  # noqa: E731
    kind = options["server_optimizer"]
    hyper = {k.removeprefix("server_"): v for k, v in options.items() if k != "server_optimizer"}
    got = reference_run(cli_run, random_case, ["fedavg", "fedvarp"], kind, {"selection": "all", **options})
    for name, reference in (("fedavg", ref.fedavg), ("fedvarp", ref.fedvarp)):
        expected = reference(U, A, x0, lr, 2, optimizer=ref.ServerOptimizer(kind, **hyper))
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=name)
        plain = reference(U, A, x0, lr, 2, options["server_lr"])
        assert not np.allclose(expected, plain, atol=1e-3), name  # the optimizer made a difference


def test_server_optimizer_state_is_counted_in_server_memory(cli_run):
    """fedavg keeps x [d]; momentum adds m, adam, adagrad and yogi m and v (float32, d = 2)."""
    memory = {}
    for kind in ("sgd", "momentum", "adam", "adagrad", "yogi"):
        config = qconfig([E1, E2], {"server_optimizer": kind}, rounds=3)
        run_dir = cli_run(config, name=kind)
        memory[kind] = json.loads((run_dir / "manifest.json").read_text())["server_memory_bytes"]
    assert memory == {"sgd": 8, "momentum": 16, "adam": 24, "adagrad": 24, "yogi": 24}


@pytest.mark.parametrize("kind", ["adagrad", "yogi"])
def test_adaptive_server_optimizers_two_rounds_by_hand(cli_run, kind):
    """One device, u = 1, x0 = 0, one exact step of lr ½: Δ_t = ½(1 − x_t). With β1 = β2 = ½,
    τ = 1, η = 1: Δ0 = ½, m0 = ¼ and v0 = Δ0² = ¼ (adagrad) or ½·Δ0² = ⅛ (yogi, from v = 0), so
    x1 = ¼ / (sqrt(v0) + 1); then Δ1 = ½(1 − x1), m1 = ½ m0 + ½ Δ1, and adagrad adds Δ1² to v
    while yogi moves v by ½Δ1² towards Δ1² (sign(v0 − Δ1²))."""
    config = qconfig([[1.0]], {"server_optimizer": kind, "server_beta1": 0.5, "server_beta2": 0.5,
                               "server_eps": 1.0}, lr=0.5, rounds=2)
    v0 = 0.25 if kind == "adagrad" else 0.125
    x1 = 0.25 / (math.sqrt(v0) + 1.0)
    d1 = 0.5 * (1.0 - x1)
    m1 = 0.125 + 0.5 * d1
    v1 = v0 + d1**2 if kind == "adagrad" else v0 - 0.5 * d1**2 * math.copysign(1.0, v0 - d1**2)
    expected = x1 + m1 / (math.sqrt(v1) + 1.0)
    if kind == "adagrad":  # the same in exact fractions: x1 = 1/6, Δ1 = 5/12, m1 = 1/3, v1 = 61/144
        assert math.isclose(expected, 1 / 6 + 4 / (math.sqrt(61) + 12), rel_tol=1e-12)
    else:  # v0 = 1/8 < Δ1²: v grows by ½Δ1² (adam's would be ½v0 + ½Δ1²)
        assert v0 < d1**2
    np.testing.assert_allclose(final_x(cli_run(config, name=kind)), [expected], rtol=1e-6)


def test_the_reference_tests_cover_every_registered_algorithm():
    covered = {"fedavg", "fedavg-all", "fedavg-known-p", "fedbuff", "fedsgd", "fedprox", "fedavg-wait", "mifa",
               "fedawe", "amplified", "fedau", "fedvarp", "sequential-sgd", "fedlaavg", "fednova",
               "scaffold", "feddyn"}
    covered |= {"fedasync"}  # async only: replayed by hand from events.parquet in tests/test_async.py
    assert set(REGISTRY) == covered


# --- alternating clients (000 App C, 001 Thm 2) ----------------------------------------------

def fedlaavg_period_map(gamma: float, t1: int, t2: int) -> np.ndarray:
    """One period of FedLaAvg (beta = 1/2, one exact step) on one coordinate, as an affine map
    of the state (x, G1, G2, 1) with e1 = 1, e2 = 0: G_i <- x − e_i, x <- x − γ (G1 + G2) / 2."""
    total = np.eye(4)
    for i in [0] * t1 + [1] * t2:
        step = np.eye(4)
        step[1 + i] = [1, 0, 0, -(1.0 - i)]  # G_i = x − e_i
        other = np.eye(4)[2 - i]  # the stale gradient of the other client
        step[0] = np.eye(4)[0] - gamma / 2 * (step[1 + i] + other)
        total = step @ total
    return total


def test_fedlaavg_alternating_clients_tends_to_the_optimum(cli_run):
    """FedAvg's biased limit on this trace is checked in test_engine.py; FedLaAvg removes it."""
    gamma, t1, t2, periods = 0.1, 3, 7, 60
    config = qconfig([E1, E2], {"name": "fedlaavg", "beta": 0.5}, lr=gamma, rounds=periods * (t1 + t2))
    x = final_x(cli_run(config, alternating_trace(t1, t2, periods)))
    # Error after C periods <= ‖M^C‖ ‖s0 − s*‖, s* = (½, ½ − 1, ½) the fixed point (coordinate 0;
    # coordinate 1 is the mirror image). s0 = (0, 0, 0): never-seen gradients count as 0.
    M = fedlaavg_period_map(gamma, t1, t2)
    s0_err = np.array([0.0, 0.0, 0.0, 1.0]) - np.array([0.5, -0.5, 0.5, 1.0])
    bound = np.linalg.norm(np.linalg.matrix_power(M, periods)[:3, :3]) * np.linalg.norm(s0_err)
    assert max(abs(np.linalg.eigvals(M[:3, :3]))) < 0.25  # it does contract
    np.testing.assert_allclose(x, [0.5, 0.5], atol=bound + FLOAT32)


# --- biased fixed point (002 Example 1) --------------------------------------------------------

def test_fedavg_all_is_biased_and_the_corrected_algorithms_are_not(cli_run):
    """Two groups of 50 devices, u = +1 online w.p. 0.8 and u = −1 online w.p. 0.2 (constant).

    fedavg-all's fixed point is Σ p_i u_i / Σ p_j = 0.6; the others' is mean u_i = 0. With one
    exact step of γ = 0.05 the iterate is an AR(1) around its fixed point: contraction
    1 − γ p̄ per round (0.975: 1e-5 after 450 rounds) and stationary variance
    Var(ξ) / (2γ p̄). For fedavg-all Var(ξ) = γ²/N² Σ p_i(1−p_i)(u_i − x*)²; for known-p,
    the noisiest of the unbiased ones (it up-weights rare devices by 1/p_i), it is
    γ²/N² Σ (1−p_i)/p_i (u_i − ū)² with p̄ = 1. MIFA, FedLaAvg and FedAWE replace missing
    updates instead of up-weighting them, so the known-p variance bounds theirs; 5σ.
    """
    n, gamma, rounds_ = 100, 0.05, 450
    p = np.repeat([0.8, 0.2], n // 2)
    u = np.repeat([1.0, -1.0], n // 2)
    biased = float((p * u).sum() / p.sum())
    sd_all = math.sqrt(gamma * (p * (1 - p) * (u - biased) ** 2).sum() / n**2 / (2 * p.mean()))
    sd_known = math.sqrt(gamma * ((1 - p) / p * (u - u.mean()) ** 2).sum() / n**2 / 2)
    algorithms = ["fedavg-all", "fedavg-known-p", "fedawe", "mifa", "fedlaavg"]
    config = qconfig([[x] for x in u.tolist()], {"selection": "all", "beta": 1.0}, lr=gamma, rounds=rounds_,
                     trace={"source": "bernoulli", "p": p.tolist()}, algorithms=algorithms)
    run_dir = cli_run(config, name="bias")
    x = {a: float(final_x(run_dir / a)[0]) for a in algorithms}
    assert abs(x["fedavg-all"] - biased) < 5 * sd_all, x
    for name in algorithms[1:]:
        assert abs(x[name] - u.mean()) < 5 * sd_known, (name, x)
    assert biased - u.mean() > 20 * sd_known  # the two fixed points are far apart


# --- echo sum (002 Prop. 1) --------------------------------------------------------------------

def test_fedawe_echo_factors_sum_to_the_round_count(cli_run):
    """One random device per round (some rounds nobody), so each round's echo_max is the echo
    factor of that device: whenever i is active in round R−1, its factors over rounds < R sum
    to R."""
    n, rounds_ = 4, 80
    who = np.random.default_rng(3).integers(-1, n, size=rounds_)
    config = quadratic_config([[1.0], [2.0], [3.0], [4.0]], rounds=rounds_, algorithm="fedawe")
    df = rounds(cli_run(config, one_per_round_trace(n, who)))
    echo = df["echo_max"].to_numpy()
    assert np.isnan(echo[who < 0]).all() and (df["arrived"].to_numpy() == (who >= 0)).all()
    sums = np.zeros(n)
    for r in np.flatnonzero(who >= 0):
        sums[who[r]] += echo[r]
        assert sums[who[r]] == r + 1, f"device {who[r]} in round {r}"
    np.testing.assert_array_equal(df["echo_mean"].to_numpy()[who >= 0], echo[who >= 0])


# --- amplification (003 App B.1) ---------------------------------------------------------------

@pytest.mark.parametrize("eta", [1.0, 2.0, 3.0, 5.0, 7.0, 10.0])
def test_amplified_fedavg_matches_the_cycle_closed_form(cli_run, eta):
    """z1, z2, z3 one per round cyclically, x0 = (1, 2), P = 3, one step of γ = 0.05 (a = 0.95):
    after C cycles x = y* + (1 − eta(1 − a³))^C (x0 − y*), y* = (a² z1 + a z2 + z3)/(1 + a + a²)."""
    gamma, cycles = 0.05, 5
    z = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, math.sqrt(3)]])
    config = qconfig(z.tolist(), {"name": "amplified", "period": 3, "eta": eta}, lr=gamma,
                     rounds=3 * cycles, model={"init": [1.0, 2.0]})
    x = final_x(cli_run(config, one_per_round_trace(3, np.arange(3 * cycles) % 3)))
    a = 1 - gamma
    fixed = (a * a * z[0] + a * z[1] + z[2]) / (1 + a + a * a)
    expected = fixed + (1 - eta * (1 - a**3)) ** cycles * (np.array([1.0, 2.0]) - fixed)
    np.testing.assert_allclose(x, expected, atol=1e-5)


def test_larger_amplification_ends_nearer_the_optimum():
    """The closed form above (checked through the engine), as the paper's Figure B.2 shows it:
    for eta up to 1/(1 − a³) ≈ 7 the distance to the optimum (0, 1/√3) after 15 rounds falls."""
    a, z = 0.95, np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, math.sqrt(3)]])
    fixed = (a * a * z[0] + a * z[1] + z[2]) / (1 + a + a * a)
    optimum = np.array([0.0, 1 / math.sqrt(3)])
    dist = [np.linalg.norm(fixed + (1 - eta * (1 - a**3)) ** 5 * ([1.0, 2.0] - fixed) - optimum)
            for eta in (1.0, 2.0, 3.0, 5.0, 7.0)]
    assert all(np.diff(dist) < 0), dist


# --- SCAFFOLD and FedDyn: the optimum is a fixed point of every round ---------------------------

STEPS = np.array([1, 2, 3, 5, 8, 4])  # each device's local steps (heterogeneous)


@pytest.fixture
def heterogeneous_steps(monkeypatch):
    """fedavg, scaffold and feddyn whose device i takes STEPS[i] local steps (`hetero-NAME`)."""
    for name in ("fedavg", "scaffold", "feddyn"):
        base = REGISTRY[name]
        cls = type(f"Hetero{base.__name__}", (base,), {"name": f"hetero-{name}",
                                                     "local_steps": lambda self, rnd, ids: STEPS[ids]})
        monkeypatch.setitem(REGISTRY, cls.name, cls)


def test_scaffold_and_feddyn_reach_the_optimum_for_any_local_steps(cli_run, heterogeneous_steps):
    """Full participation, device i takes τ_i = STEPS[i] exact steps of lr η. FedAvg's fixed
    point is Σ w_i u_i / Σ w_i with w_i = 1 − (1 − η)^τ_i (objective inconsistency); SCAFFOLD's
    and FedDyn's is the optimum mean u_i: at x*, c_i = ∇f_i(x*) (h_i = ∇f_i(x*)) a device's
    corrected gradient is 0, so it does not move, and c = mean c_i = ∇F(x*) = 0. (FedDyn gets
    there at a rate that grows with alpha: 1e-3 away after 150 rounds at alpha = 0.3, 1e-9 at 1.)"""
    U = np.random.default_rng(4).normal(size=(len(STEPS), 2)).round(3) * 2
    lr = 0.1
    names = ["hetero-fedavg", "hetero-scaffold", "hetero-feddyn"]
    config = qconfig(U.tolist(), {"selection": "all", "alpha": 1.0}, lr=lr, rounds=150,
                     trace={"source": "always"}, algorithms=names)
    run_dir = cli_run(config, name="hetero")
    x = {name: final_x(run_dir / name) for name in names}
    w = 1 - (1 - lr) ** STEPS
    biased = (w[:, None] * U).sum(0) / w.sum()
    np.testing.assert_allclose(x["hetero-fedavg"], biased, atol=1e-5)
    for name in names[1:]:
        np.testing.assert_allclose(x[name], U.mean(0), atol=1e-5, err_msg=name)
    assert np.abs(biased - U.mean(0)).max() > 0.1  # the two fixed points are far apart


def test_scaffold_and_feddyn_stay_unbiased_under_intermittent_availability(cli_run, heterogeneous_steps):
    """Bernoulli(p_i) availability with exact gradients. The fixed point (x*, c_i = ∇f_i(x*))
    above does not depend on who arrives: every round's update leaves it where it is, the absent
    devices' stale c_i included. So SCAFFOLD and FedDyn converge to the optimum mean u_i (the
    random product of the rounds' contractions: 1e-13 after 300 rounds in float64, the engine's
    float32 rounding aside), where FedAvg settles off it (its fixed point moves with the cohort)."""
    p = [0.9, 0.7, 0.5, 0.3, 0.2, 0.1]
    U = np.random.default_rng(4).normal(size=(len(STEPS), 2)).round(3) * 2
    names = ["hetero-fedavg", "hetero-scaffold", "hetero-feddyn"]
    trace = generate("bernoulli", len(p), seed=3, rounds=300, round_duration=1.0, p=p)
    config = qconfig(U.tolist(), {"selection": "all", "alpha": 1.0}, lr=0.3, rounds=300, algorithms=names)
    run_dir = cli_run(config, trace, name="bernoulli")
    x = {name: final_x(run_dir / name) for name in names}
    for name in names[1:]:
        np.testing.assert_allclose(x[name], U.mean(0), atol=1e-5, err_msg=name)
    assert np.abs(x["hetero-fedavg"] - U.mean(0)).max() > 0.1


# --- waiting cost (004 §5.1) ------------------------------------------------------------------

def max_geometric_moments(p: np.ndarray) -> tuple[float, float]:
    """E[L], E[L²] for L = max_i Geometric(p_i) (trials until each was seen once)."""
    t = np.arange(0, 2000)
    tail = 1 - np.prod(1 - (1 - p[:, None]) ** t[None, :], axis=0)  # P(L > t)
    return float(tail.sum()), float(((2 * t + 1) * tail).sum())


def test_fedavg_wait_needs_the_expected_maximum_of_geometrics_per_update(cli_run):
    """S = 3 of N = 6 devices drawn uniformly: the rounds per update are i.i.d. with the law of
    max_{i∈S} Geometric(p_i) mixed over the C(6, 3) equally likely draws."""
    p = np.array([0.9, 0.7, 0.5, 0.3, 0.2, 0.1])
    n, s, rounds_ = 6, 3, 2500
    moments = np.array([max_geometric_moments(p[list(c)]) for c in itertools.combinations(range(n), s)])
    mean, second = moments.mean(0)
    sd = math.sqrt(second - mean**2)
    assert mean >= s / (n * p.min())  # the paper's lower bound over random draws
    config = qconfig([[float(i)] for i in range(n)], {"name": "fedavg-wait", "S": s}, rounds=rounds_,
                     trace={"source": "bernoulli", "p": p.tolist()})
    df = rounds(cli_run(config))
    updates = np.flatnonzero(df["wait_seen"].to_numpy() == 1.0)  # rounds that ended a wait
    arrived = np.cumsum(df["arrived"].to_numpy())
    # each of the S devices trains once per wait, in the first round it is online
    np.testing.assert_array_equal(arrived[updates], s * np.arange(1, len(updates) + 1))
    cycles = len(updates)
    observed = (updates[-1] + 1) / cycles
    assert abs(observed - mean) < 4 * sd / math.sqrt(cycles), (observed, mean, sd, cycles)
    waited = df["wait_rounds"].to_numpy()[updates]
    np.testing.assert_array_equal(waited, np.diff(np.concatenate([[-1], updates])))


# --- FedAU weight (Wang & Ji) ------------------------------------------------------------------

def test_fedau_weight_tends_to_the_truncated_geometric_mean(cli_run):
    """Recorded intervals are i.i.d. min(Geometric(p), K), mean (1 − (1−p)^K)/p, so the pooled
    mean over all records is within 4 standard errors of it."""
    n, p, cutoff, rounds_ = 20, 0.3, 5, 1200
    config = qconfig([[float(i)] for i in range(n)], {"name": "fedau", "cutoff": cutoff}, rounds=rounds_,
                     trace={"source": "bernoulli", "p": p})
    state = torch.load(cli_run(config) / "checkpoint.pt", weights_only=False)["strategy"]
    total, count = state["interval_sum"].sum(), state["interval_count"].sum()
    k = np.arange(1, cutoff + 1)
    law = np.where(k < cutoff, p * (1 - p) ** (k - 1), (1 - p) ** (cutoff - 1))  # of min(G, K)
    mean = (1 - (1 - p) ** cutoff) / p
    assert (k * law).sum() == pytest.approx(mean)
    sd = math.sqrt((k * k * law).sum() - mean**2)
    assert abs(total / count - mean) < 4 * sd / math.sqrt(count), (total / count, mean)
    assert abs(mean - 1 / p) > 10 * sd / math.sqrt(count)  # the cutoff is visible


# --- equivalences ------------------------------------------------------------------------------

def equivalence_run(cli_run, algorithms, name, trace_file=None, options=None, **sections):
    targets = [[1.0, -1.0], [3.0, 0.5], [-2.0, 2.0], [0.0, 4.0]]
    config = qconfig(targets, options, lr=0.15, steps=3, rounds=30, model={"init": [0.5, 0.5]},
                     algorithms=algorithms, **sections)
    run_dir = cli_run(config, trace_file, name=name)
    return {a: final_x(run_dir / a) for a in algorithms}


def random_trace(n=4, rounds_=30, seed=2):
    return generate("bernoulli", n, seed=seed, rounds=rounds_, round_duration=1.0, p=[0.8, 0.6, 0.4, 0.2])


def test_mifa_is_fedlaavg_with_beta_one(cli_run):
    x = equivalence_run(cli_run, ["mifa", "fedlaavg"], "mifa", random_trace(), {"beta": 1.0})
    np.testing.assert_allclose(x["mifa"], x["fedlaavg"], atol=FLOAT32)


def test_fedawe_with_everyone_online_is_fedavg_with_the_server_lr(cli_run):
    x = equivalence_run(cli_run, ["fedawe", "fedavg"], "awe", None, {"server_lr": 0.7, "selection": "all"},
                        trace={"source": "always"})
    np.testing.assert_allclose(x["fedawe"], x["fedavg"], atol=FLOAT32)


def test_fedau_fedvarp_known_p_with_p_one_are_fedavg_all(cli_run):
    names = ["fedavg-all", "fedau", "fedvarp", "fedavg-known-p"]
    x = equivalence_run(cli_run, names, "p1", None, {"server_lr": 1.3, "selection": "all"},
                        trace={"source": "always"})
    for name in names[1:]:
        np.testing.assert_allclose(x[name], x["fedavg-all"], atol=FLOAT32, err_msg=name)


def test_amplified_with_eta_one_is_fedavg(cli_run):
    x = equivalence_run(cli_run, ["amplified", "fedavg"], "amp", random_trace(),
                        {"eta": 1.0, "period": 4, "selection": "all"})
    np.testing.assert_allclose(x["amplified"], x["fedavg"], atol=FLOAT32)


def test_batched_trainer_is_the_loop_trainer(cli_run):
    """Noisy gradients (keyed by seed, round, device) so the two trainers must agree draw by draw."""
    results = []
    names = ["fedawe", "mifa", "scaffold", "feddyn"]
    for trainer in ("batched", "loop"):
        x = equivalence_run(cli_run, names, trainer, random_trace(), {"alpha": 0.5},
                            data={"noise": 0.5}, client={"trainer": trainer})
        results.append(x)
    for name in names:
        np.testing.assert_allclose(results[0][name], results[1][name], atol=1e-5, err_msg=name)


# --- what the run directory says about the algorithm --------------------------------------------

def test_manifest_reports_the_server_memory_price(cli_run):
    """MIFA/FedVARP keep an update per device on the server; FedAWE and FedLaAvg do not."""
    names = ["fedavg", "fedawe", "fedlaavg", "mifa", "fedvarp"]
    n, d = 40, 50
    config = qconfig([[1.0] * d] * n, rounds=2, trace={"source": "always"}, algorithms=names)
    run_dir = cli_run(config, name="mem")
    mem = {a: json.loads((run_dir / a / "manifest.json").read_text())["server_memory_bytes"] for a in names}
    for name in ("mifa", "fedvarp"):
        assert mem[name] >= 4 * n * d
    for name in ("fedavg", "fedawe", "fedlaavg"):
        assert mem[name] < 4 * n * d / 4, mem


# --- names, options and the built-in comparison ---------------------------------------------------

def test_every_algorithm_name_is_accepted_by_set_and_an_unknown_one_lists_them(cli_run, tmp_path):
    from fedsim.config import load_config

    path = tmp_path / "base.toml"
    path.write_text('[data]\ndataset = "quadratic"\nclients = 1\ntargets = [[1.0]]\n')
    needs = {"fedasync": ["server.mode=async", "server.buffer=1"]}  # (its own server, refused elsewhere)
    for name in REGISTRY:
        assert load_config(path, [f"algorithm.name={name}", *needs.get(name, [])]).algorithm.name == name
    cli_run(qconfig([[1.0]], {"name": "fedawee"}), expect=2)
    err = cli_run.last_output.err
    assert err.count("\n") == 1 and "did you mean 'fedawe'" in err and "sequential-sgd" in err
    cli_run(qconfig([[1.0]], {"name": "fedlaavg", "beta": 2.0}), name="beta", expect=2)
    assert "[algorithm] beta = 2.0 for 'fedlaavg' must be in [0, 1]" in cli_run.last_output.err


def test_compare_scenario_runs_the_four_algorithms(tmp_path, capsys):
    from fedsim.cli import main

    code = main(["run", "compare", "--quiet", "--set", "run.rounds=3", "--set", "run.eval_every=3",
                 "--set", f"run.out={tmp_path}"])
    assert code == 0, capsys.readouterr().err
    summary = __import__("polars").read_parquet(tmp_path / "compare" / "summary.parquet")
    assert summary["algorithm"].to_list() == ["fedavg", "fedlaavg", "mifa", "fedawe"]
    assert summary["final_test_acc"].is_not_null().all()
    invited = rounds(tmp_path / "compare" / "fedlaavg")["invited"].to_list()
    assert invited == [10, 10, 10]  # beta = 0.1 of 100 devices


@pytest.mark.parametrize("name, options", [
    ("fedawe", {}), ("fedavg-wait", {"S": 2}), ("amplified", {"period": 4}),
    ("fedlaavg", {"beta": 0.5}), ("fedau", {"cutoff": 3}), ("fedvarp", {}),
    ("fedavg", {"server_optimizer": "adam", "server_lr": 0.3}),
    ("fedavg", {"server_optimizer": "adagrad", "server_lr": 0.3}),
    ("fedvarp", {"server_optimizer": "yogi", "server_lr": 0.3}),
    ("mifa", {"server_optimizer": "momentum"}),
    ("scaffold", {}), ("feddyn", {"alpha": 0.5}),
])
def test_resume_continues_the_algorithm_state_exactly(cli_run, name, options):
    """Stopped after 15 rounds (mid-wait, mid-period) and resumed to 30: the same rounds
    (metrics included) and model."""
    from fedsim.cli import main

    config = qconfig([[1.0, -1.0], [3.0, 0.5], [-2.0, 2.0], [0.0, 4.0]], {"name": name, **options},
                     lr=0.15, steps=2, rounds=30)
    config["run"]["eval_every"] = 15
    config["run"]["diverge_loss"] = 0  # amplified's loss passes 1000x its start here; resume is the point
    whole = cli_run(config, random_trace(), name="whole")
    config["run"]["rounds"] = 15
    half = cli_run(config, random_trace(), name="half")
    assert main(["run", "--resume", str(half), "--set", "run.rounds=30", "--quiet"]) == 0
    a, b = rounds(whole).drop("wall_s"), rounds(half).drop("wall_s")
    assert a.equals(b)
    assert np.array_equal(final_x(whole), final_x(half))


def test_algorithms_that_invite_nobody_or_draw_their_own_sample_are_not_warned_or_charged_for_it(cli_run):
    """sequential-sgd invites nobody by design (no participation warning); fedavg-wait draws its
    own sample, so a selection policy given for a comparison's other algorithms keeps no state in
    its server memory (Oort's per-device table)."""
    import json

    config = {"run": {"rounds": 6, "eval_every": 6, "algorithms": ["fedavg-wait", "sequential-sgd", "fedavg"]},
              "data": {"dataset": "digits", "clients": 12}, "server": {"timing": "ideal", "clients_per_round": 4},
              "client": {"local_steps": 2, "batch_size": 8}}
    plain = cli_run(config, name="plain")
    oort = cli_run({**config, "algorithm": {"selection": "oort"}}, name="oort")
    manifest = {(run, a): json.loads((run / a / "manifest.json").read_text())
                for run in (plain, oort) for a in ("fedavg-wait", "sequential-sgd", "fedavg")}
    assert not any("participation" in w for w in manifest[plain, "sequential-sgd"]["warnings"])
    assert manifest[oort, "fedavg-wait"]["server_memory_bytes"] == manifest[plain, "fedavg-wait"]["server_memory_bytes"]
    assert manifest[oort, "fedavg"]["server_memory_bytes"] > manifest[plain, "fedavg"]["server_memory_bytes"]
