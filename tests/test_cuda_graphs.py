"""`[client] cuda_graphs`: padded, masked local steps replayed from CUDA graphs equal the eager
batched path (to float rounding). On a CPU the same padded, masked steps run eagerly, which
checks the padding and masking arithmetic; on a GPU the captured graphs are checked too."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_modules import user_models  # noqa: F401  (fixture)
from test_training_equivalence import MODEL_SHAPES, image_task, text_task

from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.training import build_task, build_trainer
from fedsim.training.cohort import train_together
from fedsim.training.cuda_graphs import CudaGraphSteps, bucket
from fedsim.training.objective import LocalObjective

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_buckets_are_quarter_octaves():
    assert [bucket(n) for n in (0, 1, 7, 8, 9, 10, 11, 16, 17, 100, 1000)] == \
        [1, 1, 7, 8, 10, 10, 12, 16, 20, 112, 1024]
    assert all(n <= bucket(n) < 1.25 * n + 1 for n in range(1, 3000))


def trained(task, client, steps, graphs: bool, objective=LocalObjective(), rnd=3, seed=7):
    trainer = build_trainer(task, ClientConfig(**{**vars(client), "trainer": "batched", "cuda_graphs": False}),
                            seed=seed)
    if graphs:
        trainer.graphs = CudaGraphSteps(trainer)
    gen = torch.Generator().manual_seed(5)
    start = (task.init_params()[None].cpu() + 0.01 * torch.randn(len(steps), task.dim, generator=gen)).to(task.device)
    return start, trainer.train(rnd, np.arange(len(steps)), start, np.asarray(steps), 0.1, objective), trainer


def assert_close(a, b, tol=1e-5):
    moved = torch.as_tensor(a.samples > 0).cpu()
    assert float((a.deltas - b.deltas).norm() / b.deltas.norm()) < tol
    assert torch.allclose(a.loss.cpu()[moved], b.loss.cpu()[moved], rtol=tol)
    assert torch.all(a.deltas.cpu()[~moved] == 0) and torch.all(torch.isnan(a.loss.cpu()[~moved]))
    assert torch.equal(a.samples, b.samples)


STEPS = [3, 0, 1, 2, 3, 1, 2, 2, 1, 3, 2]  # 11 devices: padded to 12; some stop early, one never starts


@pytest.mark.parametrize("model", ["logreg", "mlp", "lenet5", "lstm", "char-lstm"])
def test_padded_masked_steps_equal_the_eager_path(model, monkeypatch):
    import fedsim.training.cohort as cohort

    monkeypatch.setattr(cohort, "CPU_CALL_PARAMETERS", 2**40)  # (one call: a CPU's bound would cut char-lstm's)
    shape = MODEL_SHAPES[model]
    dropout = 0.0 if model == "logreg" else 0.25
    task = text_task(model, clients=11) if shape == "text" else image_task(model, shape, clients=11, dropout=dropout)
    client = ClientConfig(batch_size=5, clip=1.0, weight_decay=0.01)
    prox = LocalObjective(prox_mu=0.1)
    _, eager, _ = trained(task, client, STEPS, graphs=False, objective=prox)
    _, replayed, trainer = trained(task, client, STEPS, graphs=True, objective=prox)
    assert_close(replayed, eager)
    assert [key[0] for key in trainer.graphs.shapes] == [12]


def test_a_per_device_linear_term_follows_its_device_through_the_sorted_rows():
    """The graphs' rows are sorted by steps: each device's row of the term goes with it."""
    task = image_task("mlp", clients=11)
    terms = 0.05 * torch.randn(len(STEPS), task.dim, generator=torch.Generator().manual_seed(9))
    objective = LocalObjective(prox_mu=0.1, linear=terms)
    _, eager, _ = trained(task, ClientConfig(batch_size=5, clip=1.0), STEPS, graphs=False, objective=objective)
    _, replayed, _ = trained(task, ClientConfig(batch_size=5, clip=1.0), STEPS, graphs=True, objective=objective)
    _, plain, _ = trained(task, ClientConfig(batch_size=5, clip=1.0), STEPS, graphs=True,
                          objective=LocalObjective(prox_mu=0.1))
    assert_close(replayed, eager)
    assert float((replayed.deltas - plain.deltas).norm()) > 1e-3  # the term moved the devices


def test_full_batches_share_a_width_bucket():
    """batch_size 0: each cohort's width is its largest local data; padded samples weigh 0."""
    task = image_task("mlp", clients=11)
    _, eager, _ = trained(task, ClientConfig(batch_size=0), STEPS, graphs=False)
    _, replayed, trainer = trained(task, ClientConfig(batch_size=0), STEPS, graphs=True)
    assert_close(replayed, eager)
    (key,) = trainer.graphs.shapes
    assert key[1] == bucket(int(task.sizes[:11].max()))


def test_module_buffers_of_finished_devices_are_kept(user_models):  # noqa: F811
    """BatchNorm's running statistics: a device whose steps are done keeps them (eager: it
    leaves the step), and padded devices never reach the results."""
    task = build_task(DataConfig(clients=11), ModelConfig(name="user_nets:resnet_bn"), seed=0,
                      device=torch.device("cpu"))
    _, eager, _ = trained(task, ClientConfig(batch_size=4), STEPS, graphs=False)
    _, replayed, _ = trained(task, ClientConfig(batch_size=4), STEPS, graphs=True)
    assert task.model.dim > task.model.param_dim  # it has buffers
    assert_close(replayed, eager)


def test_a_modules_dropout_numbers_have_static_rows_of_their_own(user_models):  # noqa: F811
    """A module's step inputs carry its dropout numbers [devices, n] (n: a forward's, not the
    batch): each replayed row takes its device's own, as an eager step does."""
    task = build_task(DataConfig(dataset="digits", clients=11), ModelConfig(name="user_nets:transformer"), seed=0,
                      device=torch.device("cpu"))
    _, eager, _ = trained(task, ClientConfig(batch_size=4), STEPS, graphs=False)
    _, replayed, trainer = trained(task, ClientConfig(batch_size=4), STEPS, graphs=True)
    assert_close(replayed, eager)
    (buffers,) = trainer.graphs.shapes.values()
    assert buffers.inputs[3].shape == (12, task.model.dropout_numbers(4)) and task.model.dropout_numbers(4) > 4


def test_lockstep_groups_replay_their_blocks():
    """Two runs' cohorts in one call (train_together) take the same graph path, block by block."""
    tasks = [image_task("mlp", clients=6, seed=s) for s in (0, 1)]
    outs = {}
    for graphs in (False, True):
        calls = []
        for s, task in enumerate(tasks):
            trainer = build_trainer(task, ClientConfig(batch_size=4, trainer="batched"), seed=s)
            if graphs:
                trainer.graphs = CudaGraphSteps(trainer)
            start = task.init_params()[None].repeat(5, 1)
            calls.append((trainer, 2, np.arange(5), start, np.array([2, 1, 0, 2, 2]), 0.1, LocalObjective()))
        outs[graphs] = train_together(calls)
    for a, b in zip(outs[True], outs[False]):
        assert_close(a, b)


# --- on a GPU: the captured graphs ----------------------------------------------------------

@CUDA
@pytest.mark.parametrize("model", ["mlp", "lenet5", "char-lstm"])
def test_captured_graphs_equal_eager_and_repeat_bit_for_bit(model):
    shape, cuda = MODEL_SHAPES[model], torch.device("cuda")
    task = text_task(model, clients=11, device=cuda) if shape == "text" else \
        image_task(model, shape, clients=11, dropout=0.25, device=cuda)
    client = ClientConfig(batch_size=5, clip=1.0)
    _, eager, _ = trained(task, client, STEPS, graphs=False)
    ends = []
    for _ in range(2):
        _, replayed, trainer = trained(task, client, STEPS, graphs=True)
        (shape,) = trainer.graphs.shapes.values()  # a graph per bucket of devices still training
        assert sorted(shape.graphs) == sorted({bucket(int((np.array(STEPS) > s).sum())) for s in range(3)})
        assert_close(replayed, eager, tol=1e-4)  # a padded cohort may take other cuDNN kernels
        ends.append(replayed.deltas)
    assert torch.equal(ends[0], ends[1])


@CUDA
def test_a_run_on_cuda_records_its_graphs_and_equals_the_eager_run(cli_run):
    base = {"run": {"rounds": 4, "eval_every": 4, "seed": 3, "device": "cuda"},
            "data": {"dataset": "digits", "clients": 20}, "model": {"name": "mlp", "dropout": 0.2},
            "server": {"timing": "ideal", "clients_per_round": 11}, "client": {"local_steps": 3, "batch_size": 8}}
    runs = {}
    for graphs in (True, False):
        run_dir = cli_run({**base, "client": {**base["client"], "cuda_graphs": graphs}}, name=f"g{graphs}")
        runs[graphs] = (json.loads((run_dir / "manifest.json").read_text()),
                        torch.load(run_dir / "model.pt"))
    assert runs[True][0]["cuda_graphs"] == {"captured": [[12, 8]], "off": None}
    assert runs[False][0]["cuda_graphs"] is None
    for name, tensor in runs[True][1].items():
        assert torch.allclose(tensor, runs[False][1][name], rtol=1e-4, atol=1e-6), name


@CUDA
def test_a_module_with_a_host_sync_trains_eagerly_with_one_warning(user_models, capsys):  # noqa: F811
    task = build_task(DataConfig(clients=4), ModelConfig(name="user_nets:syncing"), seed=0,
                      device=torch.device("cuda"))
    _, eager, _ = trained(task, ClientConfig(batch_size=4), [2, 1, 2, 2], graphs=False)
    _, replayed, trainer = trained(task, ClientConfig(batch_size=4), [2, 1, 2, 2], graphs=True)
    err = capsys.readouterr().err
    assert err.count("warning: [client] cuda_graphs") == 1 and "training eagerly" in err
    assert trainer.graphs.off
    assert torch.equal(replayed.deltas, eager.deltas)


# --- out of GPU memory ------------------------------------------------------------------------

def test_a_group_that_does_not_fit_is_split_down_to_runs(monkeypatch):
    from fedsim.training import cohort

    real = cohort._train_group
    sizes = []

    def fits_one_run(calls):
        sizes.append(len(calls))
        if len(calls) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(calls)

    tasks = [image_task("mlp", clients=6, seed=s) for s in range(3)]
    calls = [(build_trainer(t, ClientConfig(batch_size=4, trainer="batched"), seed=s), 2, np.arange(5),
              t.init_params()[None].repeat(5, 1), np.array([2, 1, 0, 2, 2]), 0.1, LocalObjective())
             for s, t in enumerate(tasks)]
    alone = [c[0].train(*c[1:]) for c in calls]
    monkeypatch.setattr(cohort, "_train_group", fits_one_run)
    for a, b in zip(train_together(calls), alone):
        assert torch.equal(a.deltas, b.deltas)
    assert sizes == [3, 2]  # the group, then its half of two; single runs train on their own


def test_a_cohort_that_does_not_fit_is_one_line_naming_the_keys(cli_run, monkeypatch):
    from fedsim.training.cohort import BatchedTrainer

    def no_memory(self, rnd, *args):
        if rnd >= 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return real(self, rnd, *args)

    real = BatchedTrainer._run_chunks
    monkeypatch.setattr(BatchedTrainer, "_run_chunks", no_memory)
    config = {"run": {"rounds": 4, "eval_every": 4}, "data": {"dataset": "digits", "clients": 20},
              "server": {"timing": "ideal", "clients_per_round": 8}, "client": {"trainer": "batched"}}
    cli_run(config, expect=2)
    err = cli_run.last_output.err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert "out of GPU memory training 8 devices" in err and "lower [server] clients_per_round" in err


def test_graphs_out_of_memory_train_eagerly_with_one_warning(monkeypatch, capsys):
    task = image_task("mlp", clients=11)
    _, eager, _ = trained(task, ClientConfig(batch_size=5), STEPS, graphs=False)
    trainer = build_trainer(task, ClientConfig(batch_size=5, trainer="batched"), seed=7)
    trainer.graphs = CudaGraphSteps(trainer)

    def no_memory(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(trainer.graphs, "_step", no_memory)
    gen = torch.Generator().manual_seed(5)
    start = task.init_params()[None] + 0.01 * torch.randn(len(STEPS), task.dim, generator=gen)
    for _ in range(2):
        result = trainer.train(3, np.arange(len(STEPS)), start, np.asarray(STEPS), 0.1)
        assert torch.equal(result.deltas, eager.deltas)
    assert capsys.readouterr().err.count("warning: [client] cuda_graphs: out of GPU memory") == 1
    assert trainer.graphs.summary() == {"captured": [], "off": "out of GPU memory with the graphs' own memory"}


@CUDA
def test_the_run_keys_choose_the_gpu_kernels():
    task = image_task("mlp", clients=4, device=torch.device("cuda"))
    build_trainer(task, ClientConfig(), seed=0, deterministic=False, tf32=True)
    assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
    build_trainer(task, ClientConfig(), seed=0)
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


def test_devices_that_finish_stop_costing_work(monkeypatch):
    """Rows sorted by steps: each step trains only the devices still training, padded to a bucket."""
    task = image_task("mlp", clients=11)
    trainer = build_trainer(task, ClientConfig(batch_size=5, trainer="batched"), seed=7)
    trainer.graphs = CudaGraphSteps(trainer)
    trained_rows = []
    body = trainer.graphs._body
    monkeypatch.setattr(trainer.graphs, "_body", lambda g, rows, objective: trained_rows.append(rows) or
                        body(g, rows, objective))
    trainer.train(3, np.arange(11), task.init_params()[None].repeat(11, 1), np.asarray(STEPS), 0.1)
    assert trained_rows == [10, 7, 3]  # 10 devices take a step, 7 a second, 3 a third


def test_a_cell_that_cannot_be_compiled_runs_unfused_with_one_warning(monkeypatch, capsys):
    from fedsim.training import kernels

    def broken_compiler(fn, **options):
        def compiled(*args):
            raise RuntimeError("InductorError: no working C compiler (simulated)\nmore lines")
        return compiled

    monkeypatch.setattr(kernels, "_FUSED", [])
    monkeypatch.setattr(torch, "compile", broken_compiler)
    task = image_task("lstm", clients=4)
    plain = trained(task, ClientConfig(batch_size=4), [2, 1, 2, 2], graphs=False)[1]
    task.model.fuse()
    for _ in range(2):
        fused = trained(task, ClientConfig(batch_size=4), [2, 1, 2, 2], graphs=False)[1]
        assert torch.equal(fused.deltas, plain.deltas)
    err = capsys.readouterr().err
    assert err.count("warning: [client] compile: the LSTM cell could not be compiled (InductorError: no working "
                     "C compiler (simulated)); running it unfused") == 1


@CUDA
def test_the_compiled_cell_equals_the_plain_one():
    from fedsim.training.architectures import lstm_cell
    from fedsim.training.kernels import fused_lstm_cell

    gates, c = torch.randn(3, 5, 32, device="cuda"), torch.randn(3, 5, 8, device="cuda")
    for a, b in zip(fused_lstm_cell(gates, c), lstm_cell(gates, c)):
        assert torch.allclose(a, b, atol=1e-6)


@CUDA
def test_runs_trained_together_on_a_gpu_equal_each_alone():
    """Lockstep's shared call on CUDA (graphs on): each run as alone, to float rounding."""
    cuda = torch.device("cuda")
    tasks = [image_task("lenet5", (1, 12, 12), clients=6, seed=s, dropout=0.2, device=cuda) for s in range(3)]
    calls = [(build_trainer(t, ClientConfig(batch_size=4, trainer="batched"), seed=s), 2, np.arange(5),
              t.init_params()[None].repeat(5, 1), np.array([2, 1, 0, 2, 3]), 0.1, LocalObjective())
             for s, t in enumerate(tasks)]
    alone = [c[0].train(*c[1:]) for c in calls]
    for together, own in zip(train_together(calls), alone):
        assert_close(together, own, tol=1e-4)


class _ResidualMLP(torch.nn.Module):
    """A residual block with dropout in it (fedsim's kernels from training rules 9)."""

    def __init__(self, n_classes):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(64, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, n_classes)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x.flatten(1)))
        return self.c(h + torch.nn.functional.dropout(torch.relu(self.b(h)), 0.25, self.training))


@CUDA
def test_gelu_and_layer_norm_mlps_on_fedsims_kernels_train_on_cuda_as_on_the_cpu():
    """Training rules 7: a user's GELU MLP with dropout trains on fedsim's kernels (its batched
    gradient in closed form) on CUDA, graphs captured, as on the CPU to float rounding; and one
    with a LayerNorm (reverse mode through the kernels); rules 8: one with ELU and Mish; rules 9:
    one with a residual block and dropout in it; rules 10: one with BatchNorm (its running
    statistics in the deltas)."""
    from fedsim.config.catalog import MODELS
    from fedsim.training.trainer import TrainResult

    MODELS.register("gelu-mlp", lambda s, n, c: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Dropout(0.25), torch.nn.Linear(32, n)))
    MODELS.register("norm-mlp", lambda s, n, c: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32), torch.nn.Tanh(), torch.nn.Linear(32, n)))
    MODELS.register("elu-mlp", lambda s, n, c: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ELU(), torch.nn.Linear(32, 16), torch.nn.Mish(),
        torch.nn.Linear(16, n)))
    MODELS.register("residual-mlp", lambda s, n, c: _ResidualMLP(n))
    MODELS.register("batch-norm-mlp", lambda s, n, c: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, n)))
    try:
        for name in ("gelu-mlp", "norm-mlp", "elu-mlp", "residual-mlp", "batch-norm-mlp"):
            tasks = [image_task(name, (1, 8, 8), clients=11, device=torch.device(d)) for d in ("cpu", "cuda")]
            assert all(t.model.code == "fedsim's kernels" for t in tasks)
            client = ClientConfig(batch_size=5, clip=1.0)
            _, on_cpu, _ = trained(tasks[0], client, STEPS, graphs=False)
            _, replayed, trainer = trained(tasks[1], client, STEPS, graphs=True)
            assert trainer.graphs.shapes
            assert_close(TrainResult(*(t.cpu() for t in (replayed.deltas, replayed.loss, replayed.samples))), on_cpu,
                         tol=1e-4)
    finally:
        del MODELS["gelu-mlp"], MODELS["norm-mlp"], MODELS["elu-mlp"], MODELS["residual-mlp"], MODELS["batch-norm-mlp"]
