"""batched trainer == loop trainer (ALGORITHMS.md §4), for every model and every SGD option."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.data.datasets import Dataset
from fedsim.training import build_task, build_trainer
from fedsim.config.catalog import MODELS as ARCHITECTURES
from fedsim.training.objective import LocalObjective
from fedsim.training.task import classification_task

CPU = torch.device("cpu")


def image_task(model: str, shape=(1, 8, 8), clients=4, dropout=0.0, seed=0, device=CPU):
    """A tiny random image dataset (fast enough for the CNNs) split over `clients`."""
    rng = np.random.default_rng(1)
    n = 24 * clients
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    y = rng.integers(0, 10, size=n)
    ds = Dataset("tiny", x, y, x[:20], y[:20], 10, scale=1 / 255)
    return classification_task(ds, DataConfig(clients=clients, partition="iid"),
                               ModelConfig(name=model, dropout=dropout, hidden=16), seed=seed, device=device)


def run_both(task, client: ClientConfig, steps, lr, prox_mu=0.0, rnd=3, linear=0.0):
    """The two paths from the same starts; `linear`: the scale of a random per-device linear term."""
    ids = np.arange(len(steps))
    rng = torch.Generator().manual_seed(5)
    start = task.init_params()[None] + 0.01 * torch.randn(len(steps), task.dim, generator=rng)
    terms = linear * torch.randn(len(steps), task.dim, generator=rng) if linear else None
    out = {}
    for path in ("batched", "loop"):
        trainer = build_trainer(task, ClientConfig(**{**vars(client), "trainer": path}), seed=7)
        out[path] = trainer.train(rnd, ids, start, np.asarray(steps), lr, LocalObjective(prox_mu=prox_mu, linear=terms))
    return start, out["batched"], out["loop"]


def assert_same(start, a, b, steps):
    end_a, end_b = start + a.deltas, start + b.deltas
    assert float((end_a - end_b).norm() / end_b.norm()) < 1e-4
    assert float((a.deltas - b.deltas).norm() / b.deltas.norm()) < 1e-3
    moved = torch.as_tensor(np.asarray(steps) > 0)
    assert torch.allclose(a.loss[moved], b.loss[moved], rtol=1e-4)
    assert torch.equal(a.samples, b.samples)
    assert torch.all(a.deltas[~moved] == 0) and torch.all(torch.isnan(a.loss[~moved]))


def text_task(model: str, clients=4, word_vectors="", dropout=0.0, seed=0, device=CPU):
    """Tiny random token rows (ids 0..11, some left padding) split over `clients`: a text
    model's input, through its embedding (learned, or fixed `word_vectors` of a file)."""
    rng = np.random.default_rng(2)
    n = 24 * clients
    x = rng.integers(0, 12, size=(n, 7))
    x[: n // 2, :3] = 0  # left padding, as fedsim/data/text.py writes it
    y = rng.integers(0, 3, size=n)
    ds = Dataset("tiny-text", x, y, x[:20], y[:20], 3, vocab_size=12, vocabulary=tuple("abcdefghij"))
    return classification_task(ds, DataConfig(clients=clients, partition="iid"),
                               ModelConfig(name=model, dropout=dropout, word_vectors=word_vectors),
                               seed=seed, device=device)


# small images keep the CNN tests fast; the layer structure is the paper's at any size
MODEL_SHAPES = {
    "logreg": (1, 8, 8), "mlp": (1, 8, 8), "lenet5": (1, 12, 12), "lstm": (1, 8, 8),
    "cnn-fmnist": (1, 8, 8), "cnn-svhn": (3, 8, 8), "cnn-cifar": (3, 8, 8),
    "cnn-cinic": (3, 8, 8), "cnn-cifar-wj": (3, 8, 8), "cnn-femnist": (1, 8, 8), "char-lstm": "text",
}


def test_every_model_is_covered():
    """resnet18-gn is an nn.Module (11 M parameters: too slow here); tests/test_modules.py runs
    residual GroupNorm modules through both paths."""
    assert set(MODEL_SHAPES) | {"resnet18-gn"} == set(ARCHITECTURES)


@pytest.mark.parametrize("model", list(MODEL_SHAPES))
def test_batched_equals_loop_every_model(model):
    """Mixed step counts (incl. 0) and per-device lr in one cohort, dropout on where it exists."""
    dropout = 0.0 if model == "logreg" else 0.2
    task = (text_task(model, dropout=dropout) if MODEL_SHAPES[model] == "text"
            else image_task(model, MODEL_SHAPES[model], dropout=dropout))
    steps = [3, 1, 0, 2]
    lr = torch.tensor([0.05, 0.1, 0.2, 0.02])
    start, a, b = run_both(task, ClientConfig(batch_size=5), steps, lr)
    assert_same(start, a, b, steps)


@pytest.mark.parametrize("model", ["lstm", "char-lstm"])
def test_batched_equals_loop_text_models(model, tmp_path):
    """Token rows through a learned embedding (each device its own table) and through fixed
    word vectors (one table shared by all, not trained)."""
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("".join(f"{w} {k} {-k / 2} 0.25\n" for k, w in enumerate("abcdefghij")))
    steps = [3, 1, 0, 2]
    lr = torch.tensor([0.05, 0.1, 0.2, 0.02])
    for task in (text_task(model), text_task("lstm", word_vectors=str(vectors))):
        start, a, b = run_both(task, ClientConfig(batch_size=5), steps, lr)
        assert_same(start, a, b, steps)
        assert float(a.deltas.norm()) > 0


@pytest.mark.parametrize("option", [
    dict(weight_decay=0.01), dict(clip=0.05), dict(batch_size=0), dict(prox=0.5),
    dict(linear=0.05), dict(linear=0.05, prox=0.5, clip=0.05, weight_decay=0.01),
])
def test_batched_equals_loop_sgd_options(option):
    prox, linear = option.pop("prox", 0.0), option.pop("linear", 0.0)
    task = build_task(DataConfig(dataset="digits", clients=6, partition="dirichlet", alpha=0.5),
                      ModelConfig(name="mlp", hidden=16, dropout=0.1), seed=0, device=CPU)
    steps = [4, 2, 0, 1, 4, 3]
    client = ClientConfig(**{"batch_size": 8, **option})
    start, a, b = run_both(task, client, steps, 0.1, prox_mu=prox, linear=linear)
    assert_same(start, a, b, steps)


def test_the_linear_term_in_chunks_equals_the_loop(monkeypatch):
    """A cohort cut into chunks of devices (a small activation budget) takes each chunk's own
    rows of the per-device term."""
    import fedsim.training.cohort as cohort

    monkeypatch.setattr(cohort, "ACTIVATION_BUDGET", 2000)
    task = build_task(DataConfig(dataset="digits", clients=6), ModelConfig(name="mlp", hidden=16), seed=0, device=CPU)
    steps = [4, 2, 0, 1, 4, 3]
    assert build_trainer(task, ClientConfig(batch_size=8, trainer="batched"), seed=7).chunk_size(np.arange(6)) < 6
    start, a, b = run_both(task, ClientConfig(batch_size=8), steps, 0.1, linear=0.05)
    assert_same(start, a, b, steps)


@pytest.mark.parametrize("path", ["batched", "loop"])
def test_the_linear_term_adds_its_row_to_every_gradient(path):
    """Quadratic task, exact gradients: a step is w − lr (w − u_i + g_i), for every device its own g_i."""
    task = build_task(DataConfig(dataset="quadratic", clients=3, targets=[[1.0, 2.0], [0.0, -1.0], [3.0, 3.0]]),
                      ModelConfig(), seed=0, device=CPU)
    trainer = build_trainer(task, ClientConfig(batch_size=0, trainer=path), seed=0)
    u = torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 3.0]])
    g = torch.tensor([[0.5, -0.5], [1.0, 0.0], [-2.0, 0.25]])
    start = torch.tensor([[0.0, 0.0], [1.0, 1.0], [-1.0, 2.0]])
    result = trainer.train(0, np.array([2, 0, 1]), start, np.array([1, 2, 1]), 0.1, LocalObjective(linear=g))
    expected = start.clone()
    for s in range(2):
        moving = torch.tensor([s < 1, True, s < 1]).unsqueeze(1)
        expected = torch.where(moving, expected - 0.1 * (expected - u[[2, 0, 1]] + g), expected)
    torch.testing.assert_close(start + result.deltas, expected)


def test_clip_bounds_every_step():
    """With clipping at c and one step, no device moves further than lr * c."""
    task = build_task(DataConfig(dataset="digits", clients=5), ModelConfig(name="logreg"), seed=0, device=CPU)
    trainer = build_trainer(task, ClientConfig(batch_size=8, clip=0.01, trainer="batched"), seed=0)
    start = task.init_params()[None].repeat(5, 1)
    res = trainer.train(0, np.arange(5), start, np.ones(5, dtype=int), 0.5)
    assert float(res.deltas.norm(dim=1).max()) <= 0.5 * 0.01 * (1 + 1e-5)


def test_prox_pulls_toward_start():
    """A huge proximal term keeps the local model close to where it started."""
    task = build_task(DataConfig(dataset="digits", clients=4), ModelConfig(name="logreg"), seed=0, device=CPU)
    trainer = build_trainer(task, ClientConfig(batch_size=8, trainer="batched"), seed=0)
    start = task.init_params()[None].repeat(4, 1)
    free = trainer.train(0, np.arange(4), start, np.full(4, 10), 0.05).deltas.norm(dim=1)
    held = trainer.train(0, np.arange(4), start, np.full(4, 10), 0.05, LocalObjective(prox_mu=15.0)).deltas.norm(dim=1)
    assert torch.all(held < 0.5 * free)


def test_cohort_order_and_subsets_do_not_change_a_device():
    """A device's result depends on (seed, round, device, start), not on who else trains."""
    task = build_task(DataConfig(dataset="digits", clients=8), ModelConfig(name="mlp", hidden=16, dropout=0.3),
                      seed=0, device=CPU)
    trainer = build_trainer(task, ClientConfig(batch_size=4, trainer="batched"), seed=1)
    start = task.init_params()[None].repeat(8, 1)
    full = trainer.train(2, np.arange(8), start, np.full(8, 3), 0.1)
    ids = np.array([6, 2])
    part = trainer.train(2, ids, start[:2], np.full(2, 3), 0.1)
    assert torch.allclose(part.deltas, full.deltas[ids], rtol=1e-5, atol=1e-7)
    again = trainer.train(2, np.arange(8), start, np.full(8, 3), 0.1)
    assert torch.equal(again.deltas, full.deltas)
    other_round = trainer.train(3, np.arange(8), start, np.full(8, 3), 0.1)
    assert not torch.allclose(other_round.deltas, full.deltas)


def test_large_cohort_is_chunked_with_the_same_result(monkeypatch):
    import fedsim.training.cohort as cohort

    task = image_task("cnn-svhn", (3, 8, 8), clients=4)
    steps = [2, 1, 2, 0]
    start, whole, _ = run_both(task, ClientConfig(batch_size=3), steps, 0.05)
    monkeypatch.setattr(cohort, "ACTIVATION_BUDGET", 1)  # one device per vmapped call
    _, chunked, _ = run_both(task, ClientConfig(batch_size=3), steps, 0.05)
    assert_same(start, whole, chunked, steps)


@pytest.mark.parametrize("model", ["logreg", "mlp", "cnn-svhn"])
def test_minibatches_larger_than_the_local_data_equal_the_loop(model):
    """Batches of 32 from devices of 13-14 samples: the batched path trains on each device's
    distinct samples (padded to 14) weighted by their draws, the loop on the drawn minibatch;
    the same loss and gradient, also with devices that stop early."""
    task = build_task(DataConfig(dataset="digits", clients=100), ModelConfig(name=model, hidden=16),
                      seed=0, device=CPU)
    ids = np.arange(0, 100, 10)
    sizes = task.client_sizes()[ids]
    batched = build_trainer(task, ClientConfig(batch_size=32, trainer="batched"), seed=7)
    width = batched.batch_width(ids)
    assert width == sizes.max() < 32 and sizes.min() < width
    steps = np.array([3, 1, 0, 2, 3, 3, 2, 1, 3, 2])
    start = task.init_params()[None] + 0.01 * torch.randn(10, task.dim, generator=torch.Generator().manual_seed(5))
    a = batched.train(4, ids, start, steps, 0.1)
    b = build_trainer(task, ClientConfig(batch_size=32, trainer="loop"), seed=7).train(4, ids, start, steps, 0.1)
    assert_same(start, a, b, steps)


def test_distinct_rows_are_the_drawn_minibatch():
    """Weights of the distinct rows are the draw counts over B: they sum to 1 per device and step,
    and the features they weight are exactly those of the drawn minibatch (a device with more
    samples than the batch is drawn as a minibatch; dropout always is)."""
    task = build_task(DataConfig(dataset="digits", clients=100), ModelConfig(name="logreg"), seed=0, device=CPU)
    ids = torch.arange(5)
    drawn = task.inputs(ids, 2, 3, 32, 9)
    distinct = task.inputs(ids, 2, 3, 32, 9, width=int(task.sizes[ids].max()))
    for step in range(3):
        x, y, w, _ = distinct(step, slice(None))
        xd, yd, wd, _ = drawn(step, slice(None))
        assert x.shape[1] < 32 == xd.shape[1] and torch.allclose(w.sum(1), torch.ones(5))
        # sum_j w_j f(x_j) == mean_b f(x_b) for a function of the sample: its features' sum
        assert torch.allclose((w[..., None, None, None] * x).sum(1), (wd[..., None, None, None] * xd).sum(1), atol=1e-5)
        assert torch.allclose((w * y).sum(1), (wd * yd).sum(1).to(torch.float32))
    dropout = build_task(DataConfig(dataset="digits", clients=100), ModelConfig(name="mlp", dropout=0.2),
                         seed=0, device=CPU)
    assert not dropout.distinct_rows()
    assert build_trainer(dropout, ClientConfig(batch_size=32, trainer="batched"), seed=0).batch_width(np.arange(5)) == 32


DENSE_STACKS = {  # nn.Sequentials that are dense layers with ReLUs and dropout between them
    "softmax regression": lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)),
    "mlp": lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 37), torch.nn.ReLU(),
                                       torch.nn.Linear(37, 10)),
    "three layers, dropout after one": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 20), torch.nn.ReLU(), torch.nn.Dropout(0.0), torch.nn.Linear(20, 12),
        torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(12, 10)),
    # training rules 7: the other activations with kernels, and one activation module used twice
    "gelu, then tanh-gelu with dropout": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 20), torch.nn.GELU(), torch.nn.Linear(20, 12),
        torch.nn.GELU(approximate="tanh"), torch.nn.Dropout(0.3), torch.nn.Linear(12, 10)),
    "tanh, sigmoid": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 20), torch.nn.Tanh(), torch.nn.Linear(20, 12), torch.nn.Sigmoid(),
        torch.nn.Linear(12, 10)),
    "silu, leaky relu in place": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 20), torch.nn.SiLU(), torch.nn.Linear(20, 12),
        torch.nn.LeakyReLU(0.2, inplace=True), torch.nn.Linear(12, 10)),
    "layer norm, gelu and dropout; tanh": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 20), torch.nn.LayerNorm(20), torch.nn.GELU(), torch.nn.Dropout(0.2),
        torch.nn.Linear(20, 12), torch.nn.Tanh(), torch.nn.Linear(12, 10)),
    # training rules 8
    "elu, selu, celu; softplus, mish": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 20), torch.nn.ELU(), torch.nn.Linear(20, 16), torch.nn.SELU(),
        torch.nn.Linear(16, 14), torch.nn.CELU(0.5), torch.nn.Dropout(0.2), torch.nn.Linear(14, 12),
        torch.nn.Softplus(), torch.nn.Linear(12, 11), torch.nn.Mish(), torch.nn.Linear(11, 10)),
    "hardswish, hardsigmoid, relu6, hardtanh": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 20), torch.nn.Hardswish(), torch.nn.Linear(20, 16),
        torch.nn.Hardsigmoid(), torch.nn.Linear(16, 14), torch.nn.ReLU6(), torch.nn.Linear(14, 12),
        torch.nn.Hardtanh(-0.5, 0.5), torch.nn.Linear(12, 10)),
    "one gelu module twice": lambda: (lambda act: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 20), act, torch.nn.Linear(20, 12), act, torch.nn.Linear(12, 10)))(
        torch.nn.GELU()),
}


@pytest.mark.parametrize("name", DENSE_STACKS)
def test_a_dense_stacks_gradient_in_closed_form_equals_reverse_mode(name):
    """Training rules 3: the gradient of dense layers with ReLUs (and dropout) between them, in
    closed form, equals reverse mode through the same kernels to float rounding, every tensor
    and every device's loss (dropout with the same uniforms)."""
    from fedsim.training.kernels import autograd_step, dense_cohort_step, lower
    from fedsim.training.losses import weighted_cross_entropy

    module = DENSE_STACKS[name]()
    with torch.no_grad():  # (a LayerNorm's weight and bias away from their ones and zeros)
        for q in module.parameters():
            q.add_(0.1 * torch.randn(q.shape, generator=torch.Generator().manual_seed(q.numel())))
    model = lower(name, module, (1, 8, 8))
    step = model.step_fn(weighted_cross_entropy, batched=True)
    assert step.__qualname__.startswith(dense_cohort_step.__name__)
    probe = torch.rand(4, 1, 8, 8)
    torch.testing.assert_close(model.predict(model.init(0), probe), module.eval()(probe), rtol=0, atol=0)
    g = torch.Generator().manual_seed(0)
    m, batch = 7, 9
    params = model.split(0.3 * torch.randn(m, model.dim, generator=g))
    x, y = torch.randn(m, batch, 1, 8, 8, generator=g), torch.randint(0, 10, (m, batch), generator=g)
    weight, u = torch.rand(m, batch, generator=g), torch.rand(m, batch, model.dropout_features, generator=g)
    (mine, losses), (theirs, their_losses) = step(params, x, y, weight, u), \
        autograd_step(model.cohort_forward, weighted_cross_entropy)(params, x, y, weight, u)
    assert [t.shape for t in mine] == [t.shape for t in theirs]
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)
        assert a.abs().max() > 0
    torch.testing.assert_close(losses, their_losses, rtol=1e-5, atol=1e-6)


def test_an_mlp_under_training_rules_2_keeps_reverse_mode_and_dropout_before_a_relu_is_not_a_dense_stack():
    from fedsim.training.kernels import lower
    from fedsim.training.losses import weighted_cross_entropy
    from fedsim.training.models import build_model

    old = build_model(ModelConfig(name="mlp"), (1, 8, 8), 10, "digits", rules=2)
    assert old.step_fn(weighted_cross_entropy, batched=True).__qualname__.startswith("autograd_step")
    odd = lower("odd", torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 20), torch.nn.Dropout(0.2),
                                           torch.nn.ReLU(), torch.nn.Linear(20, 10)), (1, 8, 8))
    assert odd.dense_stack is None
    assert odd.step_fn(weighted_cross_entropy, batched=True).__qualname__.startswith("autograd_step")
