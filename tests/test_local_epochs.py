"""`[client] local_epochs`: passes over each device's own data, in shuffled minibatches."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch
from test_modules import user_models  # noqa: F401  (fixture)
from test_training_equivalence import image_task

from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.training import build_task, build_trainer

CPU = torch.device("cpu")


def epoch_inputs(task, ids, epochs, batch, rnd=2, seed=3):
    trainer = build_trainer(task, ClientConfig(batch_size=batch, local_epochs=epochs, trainer="batched"), seed=seed)
    steps = trainer.epoch_steps()[ids]
    at = task.inputs(torch.as_tensor(ids), rnd, int(steps.max()), batch, seed, trainer.batch_width(ids), epochs)
    return trainer, steps, at


def test_each_epoch_passes_over_every_sample_once_in_minibatches():
    task = image_task("mlp", clients=5)  # 24 samples a device
    ids = np.arange(5)
    sizes = task.client_sizes()
    trainer, steps, _ = epoch_inputs(task, ids, 2.0, 5)
    assert list(steps) == [2 * int(np.ceil(n / 5)) for n in sizes]
    data = task.data
    bits_rows = []
    # the rows themselves: ClientData.epoch_batches, as the task calls it
    from fedsim.training import rng

    bits = rng.from_keys(rng.keys(3, rng.EPOCH, 2, torch.as_tensor(ids), range(2)), int(sizes.max()))
    rows, weight = data.epoch_batches(torch.as_tensor(ids), bits, int(steps.max()), 5, 5)
    for i, n in enumerate(sizes):
        own = set(data.indices[data.starts[i]:data.starts[i] + n].tolist())
        per_epoch = -(-n // 5)
        for epoch in range(2):
            picked = [r for s in range(epoch * per_epoch, (epoch + 1) * per_epoch)
                      for r, w in zip(rows[s, i].tolist(), weight[s, i].tolist()) if w > 0]
            assert sorted(picked) == sorted(own)  # every sample once
            bits_rows.append(picked)
        for s in range(int(steps[i])):  # a step's weights: 1 / its batch's size
            w = weight[s, i][weight[s, i] > 0]
            assert torch.allclose(w, torch.full_like(w, 1 / len(w))) and len(w) == (5 if (s + 1) % per_epoch else n - 5 * (per_epoch - 1))
    assert bits_rows[0] != bits_rows[1]  # a new shuffle each epoch


def test_a_devices_batches_do_not_depend_on_its_cohort():
    task = image_task("mlp", clients=6)
    _, _, alone = epoch_inputs(task, np.array([4]), 1.0, 5)
    _, _, cohort = epoch_inputs(task, np.array([1, 4, 5]), 1.0, 5)
    for s in range(4):
        assert torch.equal(alone(s, slice(None))[0][0], cohort(s, slice(None))[0][1])


def test_fractional_epochs_and_the_samples_trained():
    task = image_task("mlp", clients=4)
    n = int(task.client_sizes()[0])  # 24
    trainer = build_trainer(task, ClientConfig(batch_size=5, local_epochs=0.5, trainer="batched"), seed=0)
    assert int(trainer.epoch_steps()[0]) == 3  # half of ceil(24 / 5) = 5 minibatches, rounded up
    assert list(trainer.samples(np.array([0, 0, 0]), np.array([3, 5, 7]))) == [15, n, n + 10]
    tenth = build_trainer(build_task(DataConfig(dataset="digits", clients=30), ModelConfig(name="logreg"), seed=0,
                                     device=CPU), ClientConfig(batch_size=3, local_epochs=0.1), seed=0)
    per_epoch = -(-tenth.sizes[:-1] // 3)  # 10 to 17 minibatches of 3
    assert np.array_equal(tenth.epoch_steps(), np.maximum(np.ceil(np.round(0.1 * per_epoch, 9)), 1))


def test_batched_equals_loop_under_epochs():
    task = image_task("lenet5", shape=(1, 12, 12), clients=5)
    ends = {}
    for path in ("batched", "loop"):
        trainer = build_trainer(task, ClientConfig(batch_size=7, local_epochs=1.0, trainer=path), seed=1)
        ids = np.arange(5)
        start = task.init_params()[None].repeat(5, 1)
        result = trainer.train(3, ids, start, trainer.epoch_steps()[ids], 0.1)
        ends[path] = result
    assert float((ends["batched"].deltas - ends["loop"].deltas).norm() / ends["loop"].deltas.norm()) < 1e-4
    assert torch.equal(ends["batched"].samples, torch.as_tensor(task.client_sizes()[:5]))


BASE = {"run": {"rounds": 3, "eval_every": 3, "seed": 1}, "data": {"dataset": "digits", "clients": 12},
        "model": {"name": "logreg"}, "server": {"timing": "ideal", "clients_per_round": 6},
        "client": {"lr": 0.1}}


def test_one_epoch_of_a_batch_as_large_as_the_data_is_full_batch_gradient_descent(cli_run):
    """E epochs with minibatches that hold a device's whole data are E full-batch steps: the
    run equals batch_size = 0 with local_steps = E (to float rounding)."""
    epochs = cli_run({**BASE, "client": {**BASE["client"], "local_epochs": 2, "batch_size": 1000}}, name="e")
    full = cli_run({**BASE, "client": {**BASE["client"], "local_steps": 2, "batch_size": 0}}, name="f")
    a, b = (pl.read_parquet(d / "rounds.parquet") for d in (epochs, full))
    assert np.allclose(a["train_loss"], b["train_loss"], rtol=1e-5)
    assert np.allclose(a["test_loss"].drop_nulls(), b["test_loss"].drop_nulls(), rtol=1e-5)
    events = pl.read_parquet(epochs / "events.parquet")
    sizes = pl.read_parquet(epochs / "devices.parquet")["n_samples"].to_numpy()
    assert (events["steps"] == 2).all()
    assert np.array_equal(events["samples"].to_numpy(), 2 * sizes[events["device_id"].to_numpy()])


def test_compute_time_follows_each_devices_epochs(cli_run):
    """Model timing: a device's compute is its samples x seconds per sample, so its epoch of
    n_i samples takes n_i x that (closed form through the engine)."""
    config = {**BASE, "server": {"timing": "model", "clients_per_round": 6},
              "devices": {"model": "constant", "seconds_per_sample": 0.01, "bandwidth_bps": 1e12, "latency_s": 0.0},
              "client": {**BASE["client"], "local_epochs": 1, "batch_size": 8}}
    run = cli_run(config, name="t")
    events = pl.read_parquet(run / "events.parquet")
    sizes = pl.read_parquet(run / "devices.parquet")["n_samples"].to_numpy()[events["device_id"].to_numpy()]
    assert np.array_equal(events["steps"].to_numpy(), -(-sizes // 8))
    assert np.allclose(events["compute_s"].to_numpy(), 0.01 * sizes)


@pytest.mark.parametrize("change, says", [
    ({"client": {"local_epochs": 1, "batch_size": 0}}, "needs batch_size > 0"),
    ({"data": {"dataset": "quadratic", "clients": 12}, "client": {"local_epochs": 1}}, "no samples to pass over"),
    ({"client": {"local_epochs": -1}}, "local_epochs"),
])
def test_bad_epochs_are_one_line(cli_run, change, says):
    config = {k: {**BASE.get(k, {}), **change.get(k, {})} for k in {*BASE, *change}}
    if config["data"]["dataset"] == "quadratic":
        config.pop("model")
    cli_run(config, expect=2)
    err = cli_run.last_output.err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err, err


def test_a_batchnorm_module_trains_epochs_on_the_loop(user_models):  # noqa: F811
    """The batched call would pad an epoch's last minibatch into BatchNorm's statistics: `auto`
    takes the loop, `batched` is refused; an epoch ending on one sample is refused on both."""
    from fedsim.errors import FedsimError

    task = build_task(DataConfig(clients=6), ModelConfig(name="user_nets:resnet_bn"), seed=0, device=CPU)
    assert build_trainer(task, ClientConfig(batch_size=10, local_epochs=1), seed=0).path_for(np.arange(4)).path == "loop"
    with pytest.raises(FedsimError, match="BatchNorm would count the padding of an epoch's last, smaller minibatch"):
        build_trainer(task, ClientConfig(batch_size=10, local_epochs=1, trainer="batched"), seed=0)
    for trainer in ("loop", "batched"):
        with pytest.raises(FedsimError, match=r"device 1 has 225 samples, so its epochs end on a minibatch of one "
                                              r"sample \(batch_size = 4\).*; set batch_size = 5"):
            build_trainer(task, ClientConfig(batch_size=4, local_epochs=1, trainer=trainer), seed=0)


def test_the_loop_leaves_an_epochs_padding_out_from_training_rules_2():
    """A device of 38 samples in minibatches of 16: steps of 16, 16 and 6 samples an epoch. Under
    training rules 2 the loop computes the 6 alone (the padding's weight is 0: the same loss and
    gradient to float rounding); a run started under rules 1 keeps computing the padded 16."""
    import numpy as np
    import torch

    from fedsim.config import ClientConfig, DataConfig, ModelConfig
    from fedsim.training import ThreadPolicy, build_task, build_trainer

    task = build_task(DataConfig(dataset="digits", clients=40), ModelConfig(name="mlp", hidden=16), seed=0,
                      device=torch.device("cpu"))
    client = ClientConfig(batch_size=16, local_epochs=2, trainer="loop")
    now = build_trainer(task, client, seed=0, threads=ThreadPolicy(1))
    assert now.epoch_rows(38, 7) == [16, 16, 6, 16, 16, 6, 16] and now.epoch_rows(5, 2) == [5, 5]
    ids = np.arange(6)
    steps = now.epoch_steps()[ids]
    start = task.init_params()[None].expand(6, -1).contiguous()
    rules_2 = now.train(1, ids, start, steps, 0.1)
    rules_1 = build_trainer(task, client, seed=0, threads=ThreadPolicy(1, rules=1)).train(1, ids, start, steps, 0.1)
    assert torch.allclose(rules_2.deltas, rules_1.deltas, atol=1e-6) and torch.allclose(rules_2.loss, rules_1.loss)


def test_a_cnn_with_dropout_trains_local_epochs_on_the_loop_its_last_minibatch_with_its_own_numbers(cli_run):
    """Through the CLI: a built-in CNN with dropout on a CPU (the loop, `auto`) under local epochs
    whose last minibatches are smaller. The loop takes an epoch's last minibatch unpadded, its
    dropout uniforms too (it failed on their shapes), and equals the batched trainer to float
    rounding."""
    config = {"run": {"rounds": 2, "eval_every": 2}, "data": {"dataset": "digits", "clients": 8},
              "model": {"name": "cnn-svhn", "dropout": 0.3},
              "server": {"timing": "ideal", "clients_per_round": 4},
              "client": {"local_epochs": 1, "batch_size": 16}}
    loop = cli_run(config, name="loop")
    batched = cli_run({**config, "client": {**config["client"], "trainer": "batched"}}, name="batched")
    assert json.loads((loop / "manifest.json").read_text())["trainer"]["path"] == "loop"
    a, b = pl.read_parquet(loop / "rounds.parquet"), pl.read_parquet(batched / "rounds.parquet")
    np.testing.assert_allclose(a["train_loss"].to_numpy(), b["train_loss"].to_numpy(), rtol=1e-4)
