"""A lockstep group's receive step on a GPU (issue 40, part 1): its runs' arrivals gathered at once,
the runs of one algorithm aggregated in one batched step (`Strategy.receive_together`), their
losses and models' sums read back in one copy. Forced here on the CPU (`rounding_allowed`): each
point equals its run alone to float rounding, a run whose algorithm has no batched step (a
plugin's, an adaptive server optimizer's) takes its own, bit for bit, and a run whose plugin
raises fails alone."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from fedsim.algorithms.base import Strategy
from fedsim.algorithms.fedavg import FedAvg
from fedsim.algorithms.table import DeviceTable
from fedsim.config import config_from_dict
from fedsim.config.catalog import BUILT_IN_ALGORITHMS
from fedsim.runs.experiment import Experiment
from fedsim.studies import lockstep

BATCHED = ("fedavg", "fedavg-all", "fedavg-known-p", "fedbuff", "fedsgd", "fedprox", "fedau", "fednova", "amplified",
           "mifa", "fedlaavg", "fedvarp", "scaffold", "feddyn", "fedawe")


@pytest.fixture
def on_a_gpus_terms(monkeypatch):
    """The GPU's way of a lockstep group, on the CPU; and how often each class's batched step was taken."""
    from fedsim.algorithms.amplified import Amplified
    from fedsim.algorithms.fedawe import FedAwe
    from fedsim.algorithms.feddyn import FedDyn
    from fedsim.algorithms.fedvarp import FedVarp
    from fedsim.algorithms.mifa import Mifa
    from fedsim.algorithms.scaffold import Scaffold

    monkeypatch.setattr(lockstep, "rounding_allowed", lambda device: True)
    taken = Counter()
    for cls in (FedAvg, Amplified, Mifa, FedVarp, Scaffold, FedDyn, FedAwe):
        own = cls.__dict__["receive_together"].__func__

        def spy(c, runs, own=own):
            errors = own(c, runs)
            if errors is not None:
                taken[c.__name__] += 1
            return errors
        monkeypatch.setattr(cls, "receive_together", classmethod(spy))
    return taken


def _strategy(name):
    from fedsim.algorithms.base import make_strategy
    return make_strategy(name)


def config(tmp_path, algorithm, seed, **more):
    raw = {"run": {"rounds": 8, "eval_every": 4, "seed": seed, "name": f"{algorithm}-{seed}", "out": str(tmp_path),
                   "progress": False, "plots": False},
           "data": {"dataset": "digits", "clients": 16}, "model": {"name": "logreg"},
           "client": {"local_steps": 2, "batch_size": 8, "lr": 0.2}, "algorithm": {"name": algorithm},
           "server": {"clients_per_round": 6, "deadline": 12.0},
           "devices": {"model": "lognormal", "seconds_per_sample": 0.5, "compute_sigma": 1.0},
           "trace": {"source": "bernoulli", "p": 0.6}}
    for key, value in more.items():
        section, name = key.split("__")
        raw.setdefault(section, {})[name] = value
    return config_from_dict(raw)


def test_every_algorithm_received_together_equals_its_run_alone_to_float_rounding(tmp_path, on_a_gpus_terms,
                                                                                   monkeypatch):
    """Model timing with slow devices: the runs' arrivals differ in number each round (the batched
    steps pad them); every synchronous algorithm, two seeds each, in one group."""
    names = [n for n in BUILT_IN_ALGORITHMS if n != "fedasync"]
    own = {"amplified": {"algorithm__period": 3, "algorithm__eta": 2.0},  # (amplified within the 8 rounds)
           "fedawe": {"algorithm__clip": 0.5}}  # (clipped in some rounds)
    configs = [config(tmp_path, a, s, **own.get(a, {})) for a in names for s in (0, 1)]
    calls, train = [], lockstep.train_together
    monkeypatch.setattr(lockstep, "train_together", lambda pending: calls.append(len(pending)) or train(pending))
    together = lockstep.run_together([Experiment(c, tmp_path / "together" / c.run.name) for c in configs])
    # the runs that train in a round do so in one call, eight rounds in eight calls: a run that trained
    # nobody in a round (so asked to receive first) stays in step with the others
    assert len([c for c in calls if c]) == 8 and min(calls) < len(configs), calls
    for c, result in zip(configs, together):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        assert result.status == alone.status == "completed", c.run.name
        columns = ["round", "t_start", "t_end", "online", "invited", "arrived", "dropped", "late"]
        columns += [k for k in ("clipped", "amplified", "memory_filled", "staleness_max") if k in alone.rounds.columns]
        assert result.rounds[columns].equals(alone.rounds[columns]), c.run.name
        torch.testing.assert_close(result.params, alone.params, rtol=1e-5, atol=1e-6, msg=c.run.name)
        np.testing.assert_allclose(result.rounds["train_loss"].to_numpy(), alone.rounds["train_loss"].to_numpy(),
                                   rtol=1e-5, err_msg=c.run.name)
    assert together[names.index("amplified") * 2].rounds["amplified"].sum() == 2  # rounds 2 and 5
    clipped = together[names.index("fedawe") * 2].rounds["clipped"]
    assert 0 < clipped.sum() < len(clipped)  # some rounds clipped
    arrived = np.stack([r.rounds["arrived"].to_numpy() for r in together])
    assert (arrived.min(0) < arrived.max(0)).any()  # runs of one round with other numbers of arrivals
    assert (arrived == 0).any()  # and rounds in which nobody arrived
    classes = {type(_strategy(n)).__name__ for n in BATCHED}
    assert set(on_a_gpus_terms) == classes, on_a_gpus_terms  # their batched steps taken
    assert all(count >= 4 for count in on_a_gpus_terms.values()), on_a_gpus_terms


def test_runs_without_a_batched_step_take_their_own_bit_for_bit(tmp_path, on_a_gpus_terms):
    """An adaptive server optimizer, and a plugin's algorithm: each run receives on its own in the
    group (its arrivals gathered with the others', the same rows; the loss read back with theirs),
    its model and training losses equal to its run alone's bit for bit."""
    class HalfStep(Strategy):
        name = "half-step"

        def aggregate(self, rnd, arrivals):
            if len(arrivals):
                self.apply_update(0.5 * arrivals.deltas.mean(0))

    from fedsim.algorithms.base import register
    register(HalfStep)
    configs = [config(tmp_path, a, s, algorithm__server_optimizer="adam" if a == "fedavg" else "sgd")
               for a in ("fedavg", "half-step") for s in (0, 1)]
    together = lockstep.run_together([Experiment(c, tmp_path / "together" / c.run.name) for c in configs])
    for c, result in zip(configs, together):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        assert torch.equal(result.params, alone.params), c.run.name
        # (the test loss aside: the group's evaluations are one call, to float rounding)
        assert result.rounds.drop("wall_s", "test_loss").equals(alone.rounds.drop("wall_s", "test_loss")), c.run.name
    assert not on_a_gpus_terms  # (adam: FedAvg's batched step declined)


def test_a_plugin_that_raises_in_the_groups_receive_fails_alone(tmp_path, on_a_gpus_terms):
    """Round 3's aggregate of one run raises: that run fails with its error (its folder keeps its
    last checkpoint), its batched twin and the other runs go on to their end."""
    class Breaks(FedAvg):
        name = "breaks"

        def weights(self, rnd, arrivals):
            if rnd == 3 and self.ctx.seed == 1:
                raise ValueError("weights broke in round 3")
            return super().weights(rnd, arrivals)

    from fedsim.algorithms.base import register
    register(Breaks)
    configs = [config(tmp_path, a, s) for a in ("breaks", "mifa") for s in (0, 1)]
    together = lockstep.run_together([Experiment(c, tmp_path / "together" / c.run.name) for c in configs])
    assert isinstance(together[1], ValueError) and "round 3" in str(together[1])
    for c, result in zip(configs[:1] + configs[2:], together[:1] + together[2:]):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        assert result.status == "completed" and len(result.rounds) == 8, c.run.name
        torch.testing.assert_close(result.params, alone.params, rtol=1e-5, atol=1e-6, msg=c.run.name)


def test_tables_written_together_equal_their_writes_alone_and_restack_after_a_checkpoint():
    """Three runs' tables written in one call (rows of unequal numbers, none for one run) against
    each table's own `write`; a table given a checkpoint's tensors leaves the stack, which is made
    again."""
    torch.manual_seed(0)
    alone = [DeviceTable(6, 5, torch.device("cpu")) for _ in range(3)]
    stacked = [DeviceTable(6, 5, torch.device("cpu")) for _ in range(3)]
    for rnd, ids in enumerate([[np.array([0, 3]), np.array([1, 2, 5]), np.array([4])],
                               [np.array([3, 1, 2]), np.array([0]), np.array([5, 4])]]):
        values = [torch.randn(len(i), 5) for i in ids]
        for table, i, v in zip(alone, ids, values):
            table.write(i, v, rnd)
        DeviceTable.write_together(stacked, ids, torch.cat(values), [rnd] * 3)
        for a, b in zip(alone, stacked):
            assert torch.equal(a.rows, b.rows) and np.array_equal(a.stamp, b.stamp)
            torch.testing.assert_close(a.total, b.total, rtol=0, atol=1e-12)
        torch.testing.assert_close(DeviceTable.means_together(stacked), torch.stack([t.mean() for t in alone]))
    stack = stacked[0].stacked[0]
    assert all(t.stacked[0] is stack for t in stacked)
    stacked[1].load_state_dict(alone[1].state_dict())  # (a resume)
    DeviceTable.write_together(stacked, [np.array([2]), np.array([2]), np.array([2])], torch.ones(3, 5), [2] * 3)
    assert stacked[1].stacked[0] is not stack and stacked[1].rows[2].eq(1).all()
    assert DeviceTable.get_together(stacked, [np.array([2, 0])] * 3).shape == (6, 5)


def test_a_model_gone_non_finite_in_the_groups_receive_stops_its_run_as_alone(tmp_path, on_a_gpus_terms, monkeypatch):
    """The group reads its models' sums back at once (here one model at a time: the stacking's
    limit made tiny): a run whose model overflows stops diverged after the round it would alone;
    the run beside it goes on."""
    from fedsim.sim import receive

    monkeypatch.setattr(receive, "STACKED_FLOATS", 1)
    configs = [config(tmp_path, "fedavg", 0, client__lr=1e38, server__timing="ideal", run__diverge_loss=0),
               config(tmp_path, "fedavg", 1, server__timing="ideal")]
    together = lockstep.run_together([Experiment(c, tmp_path / "together" / c.run.name) for c in configs])
    for c, result in zip(configs, together):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        assert (result.status, result.reason) == (alone.status, alone.reason), c.run.name
    assert together[0].status == "diverged" and "non-finite model" in together[0].reason
    assert together[1].status == "completed" and on_a_gpus_terms["FedAvg"] >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (gpu_checks.sh tests runs it there)")
def test_on_a_gpu_a_group_receives_together_and_equals_its_runs_alone_to_float_rounding(tmp_path, monkeypatch):
    """The real thing on CUDA: no forcing; the batched steps taken, each point its run alone's to
    float rounding (the same rounds' invitations and arrivals)."""
    from fedsim.algorithms.mifa import Mifa

    taken = Counter()
    for cls in (FedAvg, Mifa):
        own = cls.__dict__["receive_together"].__func__
        monkeypatch.setattr(cls, "receive_together",
                            classmethod(lambda c, runs, own=own: taken.update([c.__name__]) or own(c, runs)))
    configs = [config(tmp_path, a, s, run__device="cuda") for a in ("fedavg", "fedau", "mifa") for s in (0, 1)]
    together = lockstep.run_together([Experiment(c, tmp_path / "together" / c.run.name) for c in configs])
    for c, result in zip(configs, together):
        alone = Experiment(c, tmp_path / "alone" / c.run.name).run()
        columns = ["round", "online", "invited", "arrived", "dropped", "late"]
        assert result.rounds[columns].equals(alone.rounds[columns]), c.run.name
        torch.testing.assert_close(result.params.cpu(), alone.params.cpu(), rtol=1e-4, atol=1e-5, msg=c.run.name)
    assert set(taken) == {"FedAvg", "FedAu", "Mifa"}
