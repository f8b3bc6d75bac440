"""Each Strategy driven directly (no engine) on the quadratic task against its numpy reference,
plus selection policies, checkpoints, memory accounting and option validation."""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import reference_algorithms as ref  # noqa: E402

from fedsim.algorithms import REGISTRY, Arrivals, Context, make_strategy, planned_state  # noqa: E402
from fedsim.config.catalog import ALGORITHM_OPTIONS, BUILT_IN_ALGORITHMS  # noqa: E402
from fedsim.config.catalog import SELECTIONS  # noqa: E402
from fedsim.algorithms.table import DeviceTable  # noqa: E402
from fedsim.errors import FedsimError  # noqa: E402

N, D, R = 5, 3, 40
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def scenario(seed=0):
    """Targets, a random availability trace with heterogeneous p_i (and one empty round), x0."""
    rng = np.random.default_rng(seed)
    U = rng.normal(size=(N, D)) * 2
    p = np.array([0.9, 0.7, 0.5, 0.3, 0.15])
    avail = rng.random((R, N)) < p
    avail[5] = False
    return U, avail, np.tile(p, (R, 1)), rng.normal(size=D)


def context(*, lr=lambda t: 0.2, steps=2, server_lr=0.8, options=None, selection="all",
            invite=0, known_p=None, train_pooled=None, device="cpu", device_steps=None) -> Context:
    return Context(n_devices=N, dim=D, device=torch.device(device), seed=0, server_lr=server_lr,
                   local_steps=steps, clients_per_round=invite, invite=invite,
                   options=options or {}, lr=lr, client_sizes=np.ones(N, dtype=np.int64),
                   known_p=known_p, selection=selection, train_pooled=train_pooled, device_steps=device_steps)


def local_sgd(U, ids, start, steps, lr, objective):
    """Exact local SGD of every cohort member at once on the quadratic loss plus the Strategy's
    local objective (the engine's trainer, in miniature)."""
    u = torch.as_tensor(U[ids], dtype=torch.float32, device=start.device)
    w, anchor = start.clone(), start.clone()
    linear = 0.0 if objective.linear is None else objective.linear
    for s in range(int(steps.max(initial=0))):
        active = torch.as_tensor(steps > s, device=start.device).unsqueeze(1)
        w = torch.where(active, w - lr * ((w - u) + objective.prox_mu * (w - anchor) + linear), w)
    return w - start


def drive(name, U, avail, x0, ctx, rounds=None, strategy=None):
    """Run rounds [start, rounds) like the engine under ideal timing: every invited device arrives."""
    if strategy is None:
        strategy = make_strategy(name)
        strategy.setup(N, torch.as_tensor(x0, dtype=torch.float32, device=ctx.device), ctx)
        strategy.round = 0
    keys = None
    for t in range(strategy.round, rounds or avail.shape[0]):
        ids = strategy.select(t, np.flatnonzero(avail[t]), np.random.default_rng([7, t]))
        steps = strategy.local_steps(t, ids)
        lr = strategy.client_lr(t)
        start = strategy.start_params(ids)
        deltas = local_sgd(U, ids, start, steps, lr, strategy.local_objective_of(ids))
        k, dev = len(ids), deltas.device
        strategy.receive(t, Arrivals(ids=ids, deltas=deltas, steps=torch.as_tensor(steps, device=dev),
                                     samples=torch.ones(k, device=dev), loss=torch.zeros(k, device=dev),
                                     version=np.full(k, t), lr=torch.full((k,), lr, device=dev),
                                     invited_at=np.full(k, float(t)), start=start))
        metrics = strategy.metrics()
        assert keys is None or set(metrics) == keys, "metric keys must not change between rounds"
        keys = set(metrics)
        assert all(isinstance(v, float) for v in metrics.values())
        strategy.round = t + 1
    return strategy


def pooled(U, device="cpu"):
    center = torch.as_tensor(U.mean(0), dtype=torch.float32, device=device)

    def train_pooled(rnd, params, steps, lr):
        w = params.clone()
        for _ in range(steps):
            w = w - lr * (w - center)
        return w - params

    return train_pooled


def inverse(t):
    return 0.3 / t


UNEQUAL_STEPS = np.array([1, 4, 2, 7, 3])  # each device's local steps (FedNova's τ_i)

# name, options, Context overrides, reference call
CASES = {
    "fedavg": ({}, {}, lambda U, A, P, x0, lr: ref.fedavg(U, A, x0, lr, 2, 0.8)),
    "fedavg-all": ({}, {}, lambda U, A, P, x0, lr: ref.fedavg_all(U, A, x0, lr, 2, 0.8)),
    "fedavg-known-p": ({}, {"known_p": "P"},
                       lambda U, A, P, x0, lr: ref.fedavg_known_p(U, A, x0, lr, 2, P, 0.8)),
    "fedbuff": ({}, {}, lambda U, A, P, x0, lr: ref.fedavg(U, A, x0, lr, 2, 0.8)),  # synchronous: staleness 0
    "fedsgd": ({}, {}, lambda U, A, P, x0, lr: ref.fedavg(U, A, x0, lr, 1, 0.8)),
    "fedprox": ({"mu": 0.5}, {}, lambda U, A, P, x0, lr: ref.fedavg(U, A, x0, lr, 2, 0.8, mu=0.5)),
    "fedavg-wait": ({"S": N}, {},
                    lambda U, A, P, x0, lr: ref.fedavg_wait(U, A, x0, lr, 2, lambda t: range(N), 0.8)),
    "fedlaavg": ({"beta": 0.4}, {"selection": ""},
                 lambda U, A, P, x0, lr: ref.fedlaavg(U, A, x0, lr, 2, 0.4, 0.8)),
    "mifa": ({}, {"lr": inverse}, lambda U, A, P, x0, lr: ref.mifa(U, A, x0, inverse, 2, False, 0.8)),
    "mifa-warmup": ({"warmup": True}, {"lr": inverse},
                    lambda U, A, P, x0, lr: ref.mifa(U, A, x0, inverse, 2, True, 0.8)),
    "fedawe": ({}, {}, lambda U, A, P, x0, lr: ref.fedawe(U, A, x0, lr, 2, 0.0, 0.8)),
    "fedawe-clip": ({"clip": 0.05}, {}, lambda U, A, P, x0, lr: ref.fedawe(U, A, x0, lr, 2, 0.05, 0.8)),
    "amplified": ({"period": 7, "eta": 3.0}, {},
                  lambda U, A, P, x0, lr: ref.amplified(U, A, x0, lr, 2, 7, 3.0, 0.8)),
    "fedau": ({"cutoff": 4}, {}, lambda U, A, P, x0, lr: ref.fedau(U, A, x0, lr, 2, 4, 0.8)),
    "fedvarp": ({}, {}, lambda U, A, P, x0, lr: ref.fedvarp(U, A, x0, lr, 2, 0.8)),
    "sequential-sgd": ({}, {"train_pooled": "pooled"},
                       lambda U, A, P, x0, lr: ref.sequential_sgd(U, A, x0, lambda t: 0.02, 2, 0.8)),
    "fedasync": ({"mixing": 0.3}, {}, lambda U, A, P, x0, lr: ref.fedasync(U, A, x0, lr, 2, 0.3, 0.8)),
    "fednova": ({}, {"device_steps": UNEQUAL_STEPS},
                lambda U, A, P, x0, lr: ref.fednova(U, A, x0, lr, UNEQUAL_STEPS, 0.8)),
    "scaffold": ({}, {}, lambda U, A, P, x0, lr: ref.scaffold(U, A, x0, lr, 2, 0.8)),
    "feddyn": ({"alpha": 0.3}, {}, lambda U, A, P, x0, lr: ref.feddyn(U, A, x0, lr, 2, 0.3, 0.8)),
}


def case_context(case, U, P, device="cpu"):
    options, overrides, _ = CASES[case]
    overrides = dict(overrides)
    if overrides.get("known_p") == "P":
        overrides["known_p"] = lambda t: P[int(t)]  # round duration 1 s
    if overrides.get("train_pooled") == "pooled":
        overrides.update(train_pooled=pooled(U, device), lr=lambda t: 0.02)
    return context(options=options, device=device, **overrides)


def test_every_registered_algorithm_has_a_reference_case():
    assert set(REGISTRY) <= {case.removesuffix("-warmup").removesuffix("-clip") for case in CASES}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_numpy_reference(case, device):
    U, avail, P, x0 = scenario()
    strategy = drive(case.removesuffix("-warmup").removesuffix("-clip"), U, avail, x0,
                     case_context(case, U, P, device))
    expected = CASES[case][2](U, avail, P, x0, lambda t: 0.2)
    assert strategy.params.device.type == device
    np.testing.assert_allclose(strategy.params.cpu().numpy(), expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(expected, x0), "the scenario must move the model"


@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_from_state_dict_gives_the_same_model(case):
    U, avail, P, x0 = scenario(seed=1)
    name = case.removesuffix("-warmup").removesuffix("-clip")
    whole = drive(name, U, avail, x0, case_context(case, U, P))
    half = drive(name, U, avail, x0, case_context(case, U, P), rounds=R // 2)
    buffer = io.BytesIO()
    torch.save(half.state_dict(), buffer)
    buffer.seek(0)
    resumed = make_strategy(name)
    resumed.setup(N, torch.zeros(D), case_context(case, U, P))
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    resumed.round = R // 2
    drive(name, U, avail, x0, None, strategy=resumed)
    assert torch.equal(resumed.params, whole.params)


def memory(name, n, d, options=None):
    ctx = context(options=options, known_p=lambda rnd: np.ones(n), train_pooled=lambda *a: None)
    ctx.n_devices, ctx.dim = n, d
    strategy = make_strategy(name)
    strategy.setup(n, torch.zeros(d), ctx)
    return strategy.memory_bytes(), strategy.device_memory_bytes()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_memory_grows_as_the_spec_says(name):
    """O(N·d) server state only for MIFA and FedVARP; FedLaAvg, FedAWE, SCAFFOLD and FedDyn keep
    theirs on devices."""
    d = 1000
    small, big = memory(name, 10, d), memory(name, 20, d)
    server_growth, device_growth = big[0] - small[0], big[1] - small[1]
    if name in ("mifa", "fedvarp"):
        assert server_growth >= 4 * 10 * d
    else:
        assert server_growth <= 64 * 10, f"{name}: server memory must be O(d) + O(N)"
    if name in ("fedlaavg", "fedawe", "scaffold", "feddyn"):
        assert device_growth >= 4 * 10 * d
    else:
        assert device_growth == 0
    assert small[0] >= 4 * d  # at least the global model


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_state_planned_on_the_meta_device_is_the_state_set_up(name):
    """What the memory check counts of an algorithm (set up on the meta device, nothing
    allocated) is byte for byte what it keeps once set up for real; the part named is its
    largest."""
    n, d = 20, 1000
    ctx = context(known_p=lambda rnd: np.ones(n), train_pooled=lambda *a: None)
    ctx.n_devices, ctx.dim = n, d
    state = planned_state(name, ctx)
    assert state.bytes == sum(memory(name, n, d)) and state.what.startswith(f"{name}'s state (its ")
    if name in ("mifa", "fedvarp", "fedlaavg", "fedawe", "scaffold", "feddyn"):
        table = {"fedawe": "local", "scaffold": "controls", "feddyn": "gradients"}.get(name, "table")
        assert state.what == f"{name}'s state (its {table} of {n:,} devices x {d:,} parameters)"


def test_a_state_that_cannot_be_planned_is_left_to_the_setup():
    """fedavg-known-p without the trace's probabilities: its own check speaks when set up."""
    assert planned_state("fedavg-known-p", context()).bytes == 0


def test_the_catalog_declares_each_built_in_algorithms_own_keys():
    """The config checks an algorithm's keys from the catalog (without importing torch): the
    same keys and defaults as the class the run sets up."""
    for name in BUILT_IN_ALGORITHMS:
        assert REGISTRY[name].options == ALGORITHM_OPTIONS.get(name, {}), name


@pytest.mark.parametrize("name, options, fragment", [
    ("fedprox", {"mu": -1.0}, "mu"),
    ("fedlaavg", {"beta": 1.5}, "beta"),
    ("fedawe", {"clip": -0.1}, "clip"),
    ("amplified", {"period": 0}, "period"),
    ("amplified", {"eta": 0.0}, "eta"),
    ("fedau", {"cutoff": 0}, "cutoff"),
    ("feddyn", {"alpha": 0.0}, "alpha"),
    ("fedavg-wait", {"S": N + 1}, "S"),
    ("fedasync", {"mixing": 0.0}, "mixing"),
    ("fedasync", {"mixing": 1.5}, "mixing"),
    ("fedasync", {"staleness": "linear"}, "staleness"),
])
def test_bad_options_are_one_line_errors(name, options, fragment):
    with pytest.raises(FedsimError, match=rf"\[algorithm\] {fragment} = .*{name}"):
        make_strategy(name).setup(N, torch.zeros(D), context(options=options))


def test_known_p_needs_a_trace_that_knows_p():
    with pytest.raises(FedsimError, match="fedavg-known-p.*round-indexed generator"):
        make_strategy("fedavg-known-p").setup(N, torch.zeros(D), context(known_p=None))
    with pytest.raises(FedsimError, match="fedavg-known-p.*round-indexed generator"):
        make_strategy("fedavg-known-p").setup(N, torch.zeros(D), context(known_p=lambda r: None))


def test_sequential_sgd_needs_the_pooled_trainer():
    with pytest.raises(FedsimError, match="sequential-sgd"):
        make_strategy("sequential-sgd").setup(N, torch.zeros(D), context())


def test_unknown_algorithm_lists_the_valid_names():
    with pytest.raises(FedsimError, match="did you mean 'fedawe'.*one of: fedavg, fedavg-all, .*fedawe, amplified"):
        make_strategy("fedawee")


def test_unknown_selection_is_an_error():
    with pytest.raises(FedsimError, match="selection = 'random'"):
        make_strategy("fedavg").setup(N, torch.zeros(D), context(selection="random"))


# --- selection policies ------------------------------------------------------------------------

def test_uniform_selects_k_distinct_online_devices_uniformly():
    select = SELECTIONS["uniform"](10, 3)
    online = np.array([1, 3, 4, 6, 8, 9])
    counts = np.zeros(10)
    for r in range(3000):
        ids = select(r, online, np.random.default_rng(r))
        assert len(ids) == 3 and len(set(ids)) == 3 and set(ids) <= set(online)
        assert np.all(np.diff(ids) > 0)
        counts[ids] += 1
    # each online device is chosen with probability 1/2: binomial(3000, 1/2), 5 sigma
    assert np.all(np.abs(counts[online] - 1500) < 5 * math.sqrt(3000 / 4))
    assert counts[[0, 2, 5, 7]].sum() == 0


def test_k_zero_or_large_means_every_online_device():
    online = np.array([0, 2, 3])
    for policy in SELECTIONS:
        for k in (0, 5):
            ids = SELECTIONS[policy](4, k)(0, online, np.random.default_rng(0))
            assert np.array_equal(np.sort(ids), online), policy


def test_regularized_gives_everyone_one_turn_per_permutation():
    select = SELECTIONS["regularized"](6, 2)
    rng = np.random.default_rng(0)
    everyone = np.arange(6)
    picked = np.concatenate([select(r, everyone, rng) for r in range(3)])
    assert sorted(picked) == list(range(6))  # one full permutation, nobody twice
    # offline devices popped on the way are discarded, not deferred
    select = SELECTIONS["regularized"](6, 2)
    first = select(0, np.array([0, 1]), rng)
    assert np.array_equal(first, [0, 1])
    assert len(select(1, np.array([0, 1]), rng)) == 2  # a fresh permutation was started


def test_longest_absent_prefers_the_least_recent_then_the_lowest_id():
    select = SELECTIONS["longest-absent"](5, 2)
    rng = np.random.default_rng(0)

    def round_(rnd, online, arrived=None):
        picked = select(rnd, online, rng)
        select.arrived(rnd, picked if arrived is None else np.asarray(arrived, dtype=np.int64))
        return list(picked)

    assert round_(0, np.arange(5)) == [0, 1]
    assert round_(1, np.arange(5)) == [2, 3]
    assert round_(2, np.array([0, 1, 3])) == [0, 1]
    assert round_(3, np.arange(5), arrived=[4]) == [2, 4]  # device 2 dropped: not a participation
    assert round_(4, np.arange(5)) == [2, 3]


# --- the shared per-device table ----------------------------------------------------------------

def test_device_table_keeps_its_sum_and_the_last_of_repeated_ids():
    table = DeviceTable(4, 2, torch.device("cpu"), init=torch.tensor([1.0, 2.0]))
    table.write(np.array([1, 3, 1]), torch.tensor([[5.0, 5.0], [0.0, 1.0], [7.0, 8.0]]), rnd=3)
    assert torch.equal(table.rows[1], torch.tensor([7.0, 8.0]))
    assert torch.allclose(table.mean(), table.rows.mean(0))
    assert list(table.stamp) == [-1, 3, -1, 3]
    assert table.metrics(5) == {"memory_filled": 0.5, "staleness_mean": 2.0, "staleness_max": 2.0}


@pytest.mark.parametrize("kind, v, steps", [
    # Δ = 2, 1, 2 with β1 = β2 = ½: m = 1, 1, 3/2 (on Δ); v by hand; step = m / (sqrt(v) + τ), τ = 1
    ("adam", [2.0, 1.5, 2.75], [1 / (math.sqrt(2) + 1), 1 / (math.sqrt(1.5) + 1), 1.5 / (math.sqrt(2.75) + 1)]),
    ("adagrad", [4.0, 5.0, 9.0], [1 / 3, 1 / (math.sqrt(5) + 1), 1.5 / 4]),
    # yogi: v0 = 0 + ½·4 (v < Δ²), v1 = 2 − ½·1 (v > Δ²: it shrinks, where adagrad's grows), v2 = 1.5 + ½·4
    ("yogi", [2.0, 1.5, 3.5], [1 / (math.sqrt(2) + 1), 1 / (math.sqrt(1.5) + 1), 1.5 / (math.sqrt(3.5) + 1)]),
])
def test_adaptive_server_optimizers_step_by_hand(kind, v, steps):
    from fedsim.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerConfig

    optimizer = ServerOptimizer(ServerOptimizerConfig(kind, lr=1.0, beta1=0.5, beta2=0.5, eps=1.0),
                                torch.zeros(1, dtype=torch.float64))
    for delta, v_expected, step_expected in zip([2.0, 1.0, 2.0], v, steps):
        step = optimizer.step(torch.tensor([delta], dtype=torch.float64))
        assert math.isclose(float(optimizer.v), v_expected, rel_tol=1e-12)
        assert math.isclose(float(step), step_expected, rel_tol=1e-12)
    assert optimizer.memory_bytes() == 2 * 8  # m and v
