"""Tasks: build from config, evaluate, state_dict, init; keyed randomness; trainer contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.data.datasets import Dataset
from fedsim.errors import FedsimError
from fedsim.training import build_task, build_trainer, rng
from fedsim.training.objective import PLAIN
from fedsim.training.task import classification_task

CPU = torch.device("cpu")


def test_evaluate_hand_set_logreg():
    """x = one-hot of 3 features; logits = 2x: predictions are argmax x; 3 of 4 labels agree."""
    x = np.eye(3, dtype=np.float32)[[0, 1, 2, 2]]
    y = np.array([0, 1, 2, 0])
    ds = Dataset("hand", x, y, x, y, 3)
    task = classification_task(ds, DataConfig(clients=2), ModelConfig(name="logreg"), seed=0, device=CPU)
    params = torch.cat([2 * torch.eye(3).flatten(), torch.zeros(3)])  # fc1.weight [3, 3], fc1.bias [3]
    loss, acc = task.evaluate(params)
    right = -math.log(math.exp(2) / (math.exp(2) + 2))  # CE of a correct prediction
    wrong = -math.log(1 / (math.exp(2) + 2))
    assert acc == 0.75
    assert loss == pytest.approx((3 * right + wrong) / 4, rel=1e-6)
    sd = task.state_dict(params)
    assert list(sd) == ["fc1.weight", "fc1.bias"] and torch.equal(sd["fc1.weight"], 2 * torch.eye(3))


def test_digits_task_learns():
    task = build_task(DataConfig(dataset="digits", clients=10), ModelConfig(name="logreg"), seed=0, device=CPU)
    assert task.n_classes == 10 and task.dim == 650 and task.client_sizes().sum() == len(task.data.y)
    trainer = build_trainer(task, ClientConfig(batch_size=16, lr=0.5), seed=0)
    x = task.init_params()
    first = task.evaluate(x)
    for rnd in range(15):
        res = trainer.train(rnd, np.arange(10), x[None].repeat(10, 1), np.full(10, 5), 0.5)
        x = x + res.deltas.mean(dim=0)
    loss, acc = task.evaluate(x)
    assert loss < first[0] / 3 and acc > 0.85


def test_init_is_deterministic_and_seeded():
    def init(seed):
        return build_task(DataConfig(clients=5), ModelConfig(name="mlp"), seed=seed, device=CPU).init_params()

    assert torch.equal(init(3), init(3)) and not torch.equal(init(3), init(4))
    assert init(3).dtype == torch.float32


def test_trainer_contract():
    task = build_task(DataConfig(clients=5), ModelConfig(name="logreg"), seed=0, device=CPU)
    trainer = build_trainer(task, ClientConfig(batch_size=7), seed=0)
    start = task.init_params()[None].repeat(3, 1)
    res = trainer.train(0, np.array([4, 0, 2]), start, np.array([2, 0, 3]), 0.1)
    assert res.deltas.shape == (3, task.dim) and res.deltas.dtype == torch.float32
    assert torch.equal(res.samples, torch.tensor([14, 0, 21])) and res.samples.dtype == torch.int64
    full = build_trainer(task, ClientConfig(batch_size=0), seed=0)
    res = full.train(0, np.array([4, 0]), start[:2], np.array([2, 1]), 0.1)
    assert torch.equal(res.samples, torch.as_tensor([2, 1]) * task.sizes[[4, 0]])
    with pytest.raises(ValueError):
        trainer.train(0, np.array([1]), start, np.array([1]), 0.1)
    empty = full.train(0, np.array([], dtype=np.int64), start[:0], np.array([], dtype=np.int64), 0.1)
    assert empty.deltas.shape == (0, task.dim) and empty.loss.shape == (0,) and empty.samples.shape == (0,)


def test_pooled_sgd_on_a_dataset():
    task = build_task(DataConfig(clients=5), ModelConfig(name="logreg"), seed=0, device=CPU)
    trainer = build_trainer(task, ClientConfig(batch_size=0, trainer="batched"), seed=0)
    x = task.init_params()
    delta = trainer.train_pooled(0, x, 1, 0.1)
    import torch.nn.functional as F

    w = x.clone().requires_grad_()
    F.cross_entropy(task.model.forward(task.model.split(w), task.data.x), task.data.y).backward()
    assert torch.allclose(delta, -0.1 * w.grad, atol=1e-6)


@pytest.mark.parametrize("data, model, words", [
    (DataConfig(dataset="digits"), ModelConfig(name="resnet"), "[model] name = 'resnet' is unknown"),
    (DataConfig(dataset="digits"), ModelConfig(name="lenet5"), "needs larger images"),
    (DataConfig(dataset="logistic", dim=4), ModelConfig(name="cnn-svhn"), "needs images"),
    (DataConfig(dataset="digits"), ModelConfig(name="mlp", dropout=1.0), "[model] dropout"),
])
def test_model_errors_are_one_line(data, model, words):
    with pytest.raises(FedsimError) as err:
        build_task(data, model, seed=0, device=CPU)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_bad_trainer_name():
    task = build_task(DataConfig(clients=5), ModelConfig(name="logreg"), seed=0, device=CPU)
    with pytest.raises(FedsimError, match="trainer"):
        build_trainer(task, ClientConfig(trainer="fast"), seed=0)


def test_keyed_uniforms_do_not_depend_on_the_cohort():
    ids = torch.arange(50)
    u = rng.uniform(3, rng.BATCH, 7, ids, 2, 100)
    assert torch.equal(u[[9, 41]], rng.uniform(3, rng.BATCH, 7, torch.tensor([9, 41]), 2, 100))
    assert torch.equal(u[:, :10], rng.uniform(3, rng.BATCH, 7, ids, 2, 10))
    for other in [(4, rng.BATCH, 7, 2), (3, rng.DROPOUT, 7, 2), (3, rng.BATCH, 8, 2), (3, rng.BATCH, 7, 3)]:
        seed, stream, rnd, step = other
        assert (rng.uniform(seed, stream, rnd, ids, step, 100) == u).float().mean() < 0.01
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005


def test_keyed_bits_and_uniforms_are_those_of_earlier_releases():
    """Pinned: the bits and uniforms that runs of earlier releases trained with (their dropout,
    their minibatches), and the previous release's formulas, bit for bit."""
    keys = rng.keys(0, rng.MODULE, 1, torch.tensor([3, 0]), 2)
    assert keys.tolist() == [-4403719974245602657, 2887737177358662731]
    assert rng.from_keys(keys, 3).tolist() == [[-3698578495840942715, -319174738437512648, 297315264178005613],
                                               [5015018692654330401, 3627976447618336399, 630871344436310001]]
    assert rng.uniform_of_keys(keys, 3).tolist() == [[0.7994996309280396, 0.9826974868774414, 0.016117453575134277],
                                                     [0.271864652633667, 0.1966729760169983, 0.03419959545135498]]
    assert rng.uniform(0, rng.BATCH, 1, torch.tensor([3]), 2, 3).tolist() == \
        [[0.3075183033943176, 0.14949721097946167, 0.1762794852256775]]

    def srl(z, s):
        return (z >> s) & ((1 << (64 - s)) - 1)

    def mix(z):  # the previous release's splitmix64, op by op
        z = (z ^ srl(z, 30)) * rng._signed(rng._M1)
        z = (z ^ srl(z, 27)) * rng._signed(rng._M2)
        return z ^ srl(z, 31)

    keys = torch.cat([torch.randint(-2**63, 2**63 - 1, (50,), generator=torch.Generator().manual_seed(0)),
                      torch.tensor([0, -1, -2**63, 2**63 - 1])])
    bits = mix(keys[:, None] + torch.arange(3000) * rng._signed(rng._GOLDEN))
    assert torch.equal(rng.from_keys(keys, 3000), bits)
    assert torch.equal(rng.uniform_of_keys(keys, 3000), srl(bits, 40).to(torch.float32) * 2.0**-24)
    assert torch.equal(rng.dropout_bits(keys, 3000) >> 40, bits >> 40 ^ -(1 << 23))  # the sign bit flipped
    wide = mix(keys[:3, None] + torch.arange(70_000) * rng._signed(rng._GOLDEN))  # mixed in blocks of columns
    assert torch.equal(rng.dropout_bits(keys[:3], 70_000) >> 40, wide >> 40 ^ -(1 << 23))


@pytest.mark.parametrize("p", [0.1, 0.2, 0.25, 1 / 3, 0.5, 0.9, (12345678 + 0.3) * 2**-24, (12345678 + 0.7) * 2**-24,
                               2**-30, 1e-50, 0.0, -0.5, 1 - 2**-25, 1.0, 1.5])
def test_a_dropout_threshold_keeps_exactly_the_uniforms_at_least_p(p):
    """Dropout keeps a unit where its uniform u >= p (torch's float32 comparison: p rounds to
    float32, which (k + 0.3) * 2**-24 does down); fedsim compares the integers instead. Every
    one of the 2**24 uniforms, with the lowest and the highest bits below it."""
    threshold = rng.keep_threshold(p)
    for k in torch.arange(2**24).split(2**22):
        kept = k.to(torch.float32) * 2.0**-24 >= p
        for low in (0, 2**40 - 1):
            numbers = (k << 40 | low) ^ -(1 << 63)
            assert torch.equal(kept, numbers >= threshold if threshold is not None else torch.zeros_like(kept))
    assert (threshold is None) == (p >= 1 - 2**-25)
    uniforms, numbers = rng.uniform_of_keys(torch.arange(5), 10_000), rng.dropout_bits(torch.arange(5), 10_000)
    assert torch.equal(uniforms >= p, numbers >= threshold if threshold is not None else torch.zeros_like(numbers > 0))


@pytest.mark.parametrize("m, n", [(1, 40_960), (3, 70_000), (10, 5_000), (2, 1), (5, 32_768)])
def test_dropout_divisors_made_block_by_block_are_the_numbers_compared_with_the_threshold(m, n):
    """A CPU step's divisors (`dropout_bits(..., divisors=...)`, made from each block in cache)
    are (1 - p) where a number reaches the threshold and inf where it does not, one for one."""
    key = torch.randint(-2**62, 2**62, (m,), generator=torch.Generator().manual_seed(m))
    for p in (0.1, 0.5):
        threshold, kept = rng.keep_threshold(p), torch.tensor(1 - p, dtype=torch.float32)
        numbers = rng.dropout_bits(key, n)
        assert torch.equal(rng.dropout_bits(key, n, divisors=(threshold, kept)),
                           torch.where(numbers >= threshold, kept, torch.inf))


def test_keyed_draws_of_several_steps_at_once_equal_the_draws_step_by_step():
    """The trainers draw a round's minibatches for all local steps in one call."""
    ids = torch.tensor([4, 0, 17])
    for draw in (rng.uniform, rng.normal):
        together = draw(3, rng.BATCH, 7, ids, range(5), 6)
        assert together.shape == (5, 3, 6)
        for step in range(5):
            assert torch.equal(together[step], draw(3, rng.BATCH, 7, ids, step, 6))
    assert rng.uniform(3, rng.BATCH, 7, ids, range(0), 6).shape == (0, 3, 6)


def test_the_keys_of_a_few_devices_mixed_as_python_ints_are_the_cohorts_keys():
    """A loop's device's keys are mixed in Python (`rng._FEW`), a cohort's in torch: the same bits."""
    ids = torch.tensor([0, 3, 17, 2**31 + 5, 2**62 + 1] + list(range(100, 120)))
    assert len(ids) > rng._FEW
    for step in (0, 9, range(3)):
        cohort = rng.keys(5, rng.MODULE, 12, ids, step)
        for j in (0, 3, 4, 20):
            assert torch.equal(rng.keys(5, rng.MODULE, 12, ids[j:j + 1], step), cohort[..., j:j + 1])
        assert torch.equal(rng.keys(5, rng.MODULE, 12, ids[:4], step), cohort[..., :4])


def test_stacked_keys_of_several_runs_equal_each_runs_own_keys():
    """Lockstep draws the minibatches of all runs' devices in one call: each run's columns are
    its own draws, bit for bit, whatever the other runs' seeds, rounds and cohort sizes."""
    ids = [torch.tensor([5, 0, 17]), torch.tensor([2]), torch.tensor([5, 9])]
    seeds, rounds = [3, 4, 3], [7, 7, 8]
    stacked = rng.stacked_keys(seeds, rng.BATCH, rounds, ids, range(4))
    assert stacked.shape == (4, 6)
    own = torch.cat([rng.keys(s, rng.BATCH, r, i, range(4)) for s, r, i in zip(seeds, rounds, ids)], dim=1)
    assert torch.equal(stacked, own)
    assert (stacked[:, 0] != stacked[:, 4]).all()  # device 5 of two runs: different keys


@pytest.mark.parametrize("batch_size", [8, 64])  # minibatch rows; distinct rows weighted by their draws
def test_cohorts_of_runs_trained_together_equal_each_run_alone(batch_size):
    """train_together draws the minibatches of all runs in one call and gathers their inputs
    from their partitions stacked: runs of other seeds (other partitions) and at other rounds
    (a resumed point) still train bit for bit as alone."""
    from fedsim.training.cohort import train_together

    runs = []
    for seed, rnd in ((0, 3), (1, 3), (2, 9)):
        task = build_task(DataConfig(dataset="digits", clients=20), ModelConfig(name="mlp", hidden=16), seed=seed, device=CPU)
        trainer = build_trainer(task, ClientConfig(batch_size=batch_size, trainer="batched"), seed=seed)
        ids = np.array([4, 0, 11]) + seed
        start = task.init_params().expand(len(ids), -1)
        runs.append((trainer, rnd, ids, start, np.array([3, 2, 3]), 0.1, PLAIN))
    together = train_together(runs)
    assert runs[0][0].stacked_clients[1] is not None  # one dataset: the inputs were one call
    for call, shared in zip(runs, together):
        alone = call[0].train(*call[1:])
        assert torch.equal(shared.deltas, alone.deltas) and torch.equal(shared.loss, alone.loss)
    # a run of local epochs beside them (its own shuffles): each run's inputs on their own
    task = runs[1][0].task
    epochs = build_trainer(task, ClientConfig(batch_size=batch_size, local_epochs=1.0, trainer="batched"), seed=1)
    mixed = [runs[0], (epochs, *runs[1][1:])]
    for call, shared in zip(mixed, train_together(mixed)):
        assert torch.equal(shared.deltas, call[0].train(*call[1:]).deltas)


def test_only_softmax_regression_has_the_closed_form_gradient():
    names = {name: build_task(DataConfig(clients=5), ModelConfig(name=name), seed=0, device=CPU).model.is_linear
             for name in ("logreg", "mlp", "lstm")}
    assert names == {"logreg": True, "mlp": False, "lstm": False}


def test_auto_rule():
    from fedsim.training.auto import prefers_batched

    assert prefers_batched(False, 100, "cpu") and prefers_batched(True, 100, "cuda")
    assert not prefers_batched(True, 100, "cpu") and not prefers_batched(False, 1, "cuda")


@pytest.mark.parametrize("model, same_as", [("mlp", "batched"), ("cnn-svhn", "loop")])
def test_auto_dispatches_bit_for_bit(model, same_as):
    task = build_task(DataConfig(clients=4), ModelConfig(name=model, hidden=8), seed=0, device=CPU)
    start = task.init_params()[None].repeat(4, 1)
    results = {
        path: build_trainer(task, ClientConfig(batch_size=4, trainer=path), seed=0)
        .train(1, np.arange(4), start, np.array([2, 1, 2, 0]), 0.1).deltas
        for path in ("auto", same_as)
    }
    assert torch.equal(results["auto"], results[same_as])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("model", ["mlp", "cnn-svhn", "lstm"])
def test_cuda_matches_cpu(model):
    """Everything lives on task.device; a CUDA run is the CPU run up to float rounding."""
    ends = {}
    for device, path in ((CPU, "loop"), (torch.device("cuda"), "batched"), (torch.device("cuda"), "loop")):
        task = build_task(DataConfig(clients=4), ModelConfig(name=model, hidden=8, dropout=0.2), seed=0,
                          device=device)
        start = task.init_params()[None].repeat(4, 1)
        res = build_trainer(task, ClientConfig(batch_size=4, trainer=path), seed=0).train(
            1, np.arange(4), start, np.array([2, 1, 2, 0]), 0.1)
        assert res.deltas.device.type == device.type
        ends[(device.type, path)] = (start + res.deltas).cpu()
        assert task.evaluate(start[0])[1] is not None
    ref = ends[("cpu", "loop")]
    for end in ends.values():
        assert float((end - ref).norm() / ref.norm()) < 1e-4


@pytest.mark.parametrize("name, shape, fc1_in, count", [
    # LeNet-5 with padding 2 on 28x28: the classic 61,706 parameters
    ("lenet5", (1, 28, 28), 400, 156 + 2416 + 48120 + 10164 + 850),
    # FedAWE Table 6, 3x3 convs of 32 with padding 1, on 3x32x32: fc1 reads 32 x 8 x 8 = 2048
    ("cnn-svhn", (3, 32, 32), 2048, 896 + 9248 + 2048 * 128 + 128 + 1290),
    ("cnn-cifar", (3, 32, 32), 2048, 896 + 9248 + 2048 * 256 + 256 + 256 * 64 + 64 + 650),
    ("cnn-cinic", (3, 32, 32), 2048, 896 + 9248 + 2048 * 512 + 512 + 512 * 256 + 256 + 2570),
    # Wang & Ji Table D.2, 5x5 convs with padding 2: fmnist 32 x 7 x 7 = 1568, cifar 64 x 8 x 8
    ("cnn-fmnist", (1, 28, 28), 1568, 832 + 25632 + 1568 * 128 + 128 + 1290),
    ("cnn-cifar-wj", (3, 32, 32), 4096, 2432 + 51264 + 4096 * 512 + 512 + 512 * 128 + 128 + 1290),
])
def test_paper_architectures_have_the_papers_shapes(name, shape, fc1_in, count):
    from fedsim.training.models import build_model

    model = build_model(ModelConfig(name=name), shape, 10, "images")
    assert dict((q.name, q.shape) for q in model.params)["fc1.weight"][1] == fc1_in
    assert model.dim == count


@pytest.mark.parametrize("trainer", ["loop", "batched"])
@pytest.mark.parametrize("epochs", [0.0, 1.5])
def test_steps_samples_gathered_at_once_are_those_gathered_step_by_step(monkeypatch, trainer, epochs):
    """A round's minibatches are gathered for all steps in one call where they are small (a
    loop's device) and step by step otherwise: the same samples, so the same numbers bit for bit."""
    from fedsim.training import task as task_module

    task = build_task(DataConfig(dataset="digits", clients=8), ModelConfig(name="mlp"), seed=3,
                      device=torch.device("cpu"))
    client = ClientConfig(batch_size=6, local_steps=4, local_epochs=epochs, trainer=trainer)
    ids = np.array([1, 4, 6])
    steps = build_trainer(task, client, seed=3).epoch_steps()
    steps = steps[ids] if steps is not None else np.full(3, 4)
    start = task.init_params()[None].expand(3, -1).contiguous()

    def trained():
        return build_trainer(task, client, seed=3).train(2, ids, start, steps, 0.1)

    at_once = trained()
    monkeypatch.setattr(task_module, "GATHERED_AT_ONCE", 0)
    by_step = trained()
    assert torch.equal(at_once.deltas, by_step.deltas) and torch.equal(at_once.loss, by_step.loss)
    inputs = task.inputs(torch.as_tensor(ids), 2, 4, 6, 3, epochs=epochs)
    monkeypatch.setattr(task_module, "GATHERED_AT_ONCE", 2**40)
    gathered = task.inputs(torch.as_tensor(ids), 2, 4, 6, 3, epochs=epochs)
    for step in range(4):
        for which in (slice(None), torch.tensor([0, 2])):
            assert all(torch.equal(a, b) for a, b in zip(inputs(step, which), gathered(step, which)))
