"""A Task: the dataset, its partition over the clients and the model, all on the run's device.

Besides the public API the engine uses (init, evaluate, state_dict, sizes), a task gives the
trainers three things: `split`, views of flat parameters as the model's tensors; `inputs`,
a cohort's minibatch draws of all local steps of a round in one call (keyed randomness) and
a device-side gather per step; and the gradients and loss of a step: `step_fn` for one device (the loop
trainer), `cohort_step_fn` for m devices with stacked parameters (the batched trainer).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, ContextManager

import numpy as np
import torch
from torch import Tensor

from fedsim.config import DataConfig, ModelConfig
from fedsim.data.clients import ClientData
from fedsim.data.dataset import Dataset
from fedsim.data.partition import partition
from fedsim.training import rng
from fedsim.training import rules as training_rules
from fedsim.training.evaluate import chunk_size, evaluate_classifier, evaluate_per_device, local_losses
from fedsim.training.local_buffers import DeviceBuffers
from fedsim.training.losses import StepFn, mean_cross_entropy, weighted_cross_entropy
from fedsim.training.models import Model, build_model, input_shape, model_dim

CPU_LOOP_PARAMETERS = 2**18  # floats a device (1 MiB) above which `auto` trains on a CPU's loop (rules 7)
CPU_FUNC_LOOP_PARAMETERS = 2**16  # the same for a module through torch.func (rules 8)
CPU_EPOCHS_LOOP_PARAMETERS = 2**17  # the same under local epochs (rules 8)
DRAWN_AT_ONCE = 2**24  # dropout numbers of several local steps drawn in one call off a CPU (128 MiB of int64)
# (local step, which of the round's devices: a slice or positions) -> their inputs [m, ...]
StepInputs = Callable[[int, "slice | Tensor"], tuple[Tensor, ...]]


class Task:
    n_clients: int
    dim: int
    device: torch.device
    n_classes: int | None
    func_steps: bool = False  # its steps are torch.func calls of a user's nn.Module: one thread (threads.py)
    activations: int = 0  # floats of layer outputs per sample (0: no need to chunk a cohort)
    sizes: Tensor  # int64 [N + 1] samples per client; the last entry is the pooled client
    pooled: int  # id of the virtual client holding all data (= n_clients)
    device_buffers: DeviceBuffers | None = None  # [model] local_buffers: buffers kept per device

    def init_params(self) -> Tensor:
        raise NotImplementedError

    def client_sizes(self) -> np.ndarray:
        return self.sizes[: self.n_clients].cpu().numpy()

    def label_distribution(self) -> np.ndarray | None:
        return None

    def device_columns(self) -> dict[str, np.ndarray]:
        """What devices.parquet records of each device's data: `n_samples` (training samples),
        and for a dataset with its own clients the `user` and its `n_test_samples`."""
        return {"n_samples": self.client_sizes()}

    @property
    def own_test_data(self) -> bool:
        """Whether devices have test data of their own (datasets with their own clients)."""
        return False

    def device_metrics(self, params: Tensor) -> dict[str, np.ndarray]:
        """Each device's test metrics on its own test data (when `own_test_data`)."""
        return {}

    def evaluate(self, params: Tensor) -> tuple[float, float | None]:
        raise NotImplementedError

    def local_losses(self, ids: np.ndarray, params: Tensor) -> np.ndarray:
        """Each device's mean loss [k] (float64) of the global model `params` [d] over its own
        training data: what power-of-choice asks its candidates."""
        raise NotImplementedError

    def state_dict(self, params: Tensor) -> dict[str, Tensor]:
        """model.pt's tensors, on the CPU so that the file loads on any machine."""
        raise NotImplementedError

    def load_state_dict(self, saved: dict[str, Tensor]) -> Tensor:
        """The flat parameters of a state_dict with `state_dict`'s names and shapes."""
        return torch.cat([t.reshape(-1).float() for t in saved.values()])

    def split(self, flat: Tensor) -> tuple[Tensor, ...]:
        """Views of parameters [..., d] as the model's tensors [..., *shape]."""
        return (flat,)

    def cohort_slow_on_cpu(self, local_epochs: float = 0.0) -> str:
        """Why `auto` takes the loop on a CPU for this training ('': the cohort in one call)."""
        return ""

    def trained_in_place(self, ws: tuple[Tensor, ...]) -> ContextManager[tuple[Tensor, ...]]:
        """The tensors one device's loop steps read and update in place, holding its state `ws`
        (`split`'s views of its row, without the device dimension) and writing them back after
        its last step: `ws` themselves by default."""
        return nullcontext(ws)

    draws_minibatches = False  # whether `inputs` draws minibatches from rng.BATCH uniforms
    plain_loop_step = False  # whether the loop updates as torch's SGD does (`sgd_update_`'s `fused_lr`)
    # whether a sample's output depends on the other samples of its batch (BatchNorm): the
    # loop then trains on a step's own samples, without the padding of a smaller minibatch
    batch_statistics = False
    # whether a sample's output reads only its own input (and dropout numbers): a batch padded
    # to a wider one computes the same for its samples (CUDA graphs share widths)
    samples_independent = True

    def inputs_stack(self) -> bool:
        """Whether a round's inputs depend on the seed only through the minibatch draws, so
        that the cohorts of several runs on one dataset can take theirs in one `inputs` call
        (`data` = their stacked partitions)."""
        return False

    def inputs(self, ids: Tensor, rnd: int, steps: int, batch_size: int, seed: int,
               width: int | None = None, epochs: float = 0.0, draws: Tensor | None = None,
               data=None, cut: bool = False) -> StepInputs:
        """The inputs of local steps 0..steps-1 of devices `ids` [m] in round `rnd`. What can be
        drawn for all steps at once (minibatch sample ids) is, in one call; the returned
        function gathers one step's inputs for some of the devices. `width`: samples per device
        in a step, padded (`Trainer.batch_width`); None: the batch size, or each device's
        largest local data set. `epochs` > 0: minibatches of shuffled epochs (`[client]
        local_epochs`) instead of draws with replacement. `draws`: the minibatch uniforms
        `rng.uniform(seed, rng.BATCH, rnd, ids, range(steps), batch_size)` where a caller drew
        them for several runs at once (fedsim/training/cohort.py); `data`: the ClientData to
        draw from instead of the task's own (several runs' stacked, `inputs_stack`); `cut`: the
        caller computes a step on each device's own samples, not on the padded batch (the loop
        trainer under local epochs), so a module's dropout numbers are those of the own forward
        as drawn."""
        raise NotImplementedError

    def distinct_rows(self) -> bool:
        return False

    def batch_problem(self, batch_size: int = 1, epochs: float = 0.0) -> str:
        """Why the model cannot train batched on minibatches of `batch_size` (0: the full local
        data; `epochs`: local epochs) ('': it can)."""
        return ""

    def step_fn(self) -> StepFn:
        raise NotImplementedError

    def cohort_step_fn(self) -> StepFn:
        """`step_fn` over stacked devices: tensors and inputs [m, ...] -> (gradients [m, ...], losses [m])."""
        raise NotImplementedError

    def step_flops(self, batch: int) -> float:
        """Multiply-adds of one device's local step (forward and backward) on `batch` samples."""
        return 3.0 * self.dim * batch

    def train_flops_per_sample(self) -> float:
        """FLOPs (2 per multiply-add) of training on one sample, forward and backward: what a
        device's compute time is made of under `[devices] model = "profiles"`."""
        return 2.0 * self.step_flops(1)

    def evaluate_flops(self) -> float:
        """Multiply-adds of the largest call of `evaluate`."""
        return float(self.dim * self.n_clients)

    def data_bytes(self) -> int:
        """Bytes of the task's data on its device (what training reads besides parameters)."""
        return 0


class ClassificationTask(Task):
    """Cross-entropy on a partitioned labelled dataset with a `Model` (fedsim/training/models.py)."""

    def __init__(self, data: ClientData, model: Model, seed: int):
        self.data, self.model, self.seed = data, model.to(data.device), seed
        self.n_clients, self.n_classes = data.n_clients, data.n_classes
        self.dim, self.device = model.dim, data.device
        self.activations = model.activations
        self.batch_statistics, self.samples_independent = model.batch_statistics, model.samples_independent
        self.func_steps = model.func_steps

        self.sizes, self.pooled = data.sizes, data.pooled
        if model.local_buffers:
            self.device_buffers = DeviceBuffers(slice(model.param_dim, model.dim), self.n_clients + 1, self.device)

    def init_params(self) -> Tensor:
        return self.model.init(self.seed).to(self.device)

    def cohort_slow_on_cpu(self, local_epochs: float = 0.0) -> str:
        """Why a loop of devices is faster on a CPU: the model's reasons
        (`ModuleModel.cohort_slow_on_cpu`), and from training rules 7 parameters of more than
        `CPU_LOOP_PARAMETERS` floats a device: a batched step reads and writes every device's
        weights, which no cache holds, where a loop keeps one device's in cache through its steps
        (a dense layer 784 x 400 at 100 devices: 1.8x a plain loop's round batched, 0.8x on the
        loop; char-lstm 4.7x faster on the loop; benchmarks/RESULTS.md, "Training rules 7").
        From rules 8, a module through torch.func of more than `CPU_FUNC_LOOP_PARAMETERS`: vmap's
        cohort step is slower than a loop of plain steps (an MLP with a residual block, 118 k:
        1.3-2.2x a plain loop's round); and under local epochs any model of more than
        `CPU_EPOCHS_LOOP_PARAMETERS`: devices of unequal data take unequal steps, and a cohort's
        call steps each as long as its longest, masking the others' (MLPs of 159-235 k parameters
        on fedsim's kernels: 0.91-1.05x a plain loop's round batched, 0.71-0.84x on the loop;
        "Training rules 8"). From rules 9 the same 2^16 for a model on fedsim's kernels whose cohort
        step is reverse mode over vectors, without a closed form (residual blocks: an MLP with one,
        118 k, 1.02-1.28x a plain loop's round batched, 0.81-0.97x on the loop; "Training rules 9")."""
        model = self.model
        why = model.cohort_slow_on_cpu  # (asked only where it decides: a module may probe vmap for it)
        if not why and model.rules >= 7 and model.param_dim > CPU_LOOP_PARAMETERS:
            why = f"{model.param_dim:,} parameters a device, more than a CPU's cache keeps for a cohort's step"
        if not why and model.rules >= 8 and model.func_steps and model.param_dim > CPU_FUNC_LOOP_PARAMETERS:
            why = (f"{model.param_dim:,} parameters a device through torch.func, whose cohort step is slower "
                   "there than a loop of plain steps")
        if not why and model.rules >= 9 and model.reverse_mode_cohort and model.param_dim > CPU_FUNC_LOOP_PARAMETERS:
            why = (f"{model.param_dim:,} parameters a device whose cohort step is reverse mode (no closed form), "
                   "slower there than a loop of steps")
        if not why and local_epochs and model.rules >= 8 and model.param_dim > CPU_EPOCHS_LOOP_PARAMETERS:
            why = (f"{model.param_dim:,} parameters a device under local epochs, whose devices of unequal data a "
                   "cohort's call steps as long as its longest")
        return why

    def label_distribution(self) -> np.ndarray:
        return self.data.label_distribution()

    @property
    def own_test_data(self) -> bool:
        return self.data.owner_test is not None

    def served(self, params: Tensor) -> Tensor:
        """The server's parameters as evaluated and saved (local buffers: the devices' mean)."""
        return params if self.device_buffers is None else self.device_buffers.served(params)

    def device_metrics(self, params: Tensor) -> dict[str, np.ndarray]:
        return evaluate_per_device(self.model, self.served(params), self.data) if self.own_test_data else {}

    def device_columns(self) -> dict[str, np.ndarray]:
        columns = super().device_columns()
        if self.data.users is not None:
            owner = self.data.owner_test
            columns |= {"user": self.data.users.astype(str),
                        "n_test_samples": torch.bincount(owner[owner >= 0], minlength=self.n_clients).cpu().numpy()}
        return columns

    def evaluate(self, params: Tensor) -> tuple[float, float]:
        return evaluate_classifier(self.model, self.served(params), self.data)

    def local_losses(self, ids: np.ndarray, params: Tensor) -> np.ndarray:
        return local_losses(self.model, self.served(params), self.data, ids)

    def state_dict(self, params: Tensor) -> dict[str, Tensor]:
        return self.model.state_dict(self.served(params))

    def load_state_dict(self, saved: dict[str, Tensor]) -> Tensor:
        return self.model.load_state_dict(saved)

    def split(self, flat: Tensor) -> tuple[Tensor, ...]:
        return self.model.split(flat)

    def trained_in_place(self, ws: tuple[Tensor, ...]) -> ContextManager[tuple[Tensor, ...]]:
        return self.model.trained_in_place(ws)

    draws_minibatches = True

    def inputs_stack(self) -> bool:
        return not self.model.draws_randomness  # (dropout keys are the seed's)

    def inputs(self, ids, rnd, steps, batch_size, seed, width=None, epochs=0.0, draws=None, data=None, cut=False):
        data, model = self.data if data is None else data, self.model
        if draws is None and batch_size > 0 and not epochs:
            draws = rng.uniform(seed, rng.BATCH, rnd, ids, range(steps), batch_size)
        if epochs:
            # random bits of each (device, epoch); counter-based, so a device's shuffle does
            # not depend on the cohort it trains in
            largest = int(data.sizes[ids].max())
            bits = rng.from_keys(rng.keys(seed, rng.EPOCH, rnd, ids, range(math.ceil(epochs))), largest)
            rows, weight = data.epoch_batches(ids, bits, steps, batch_size, width or batch_size)
            samples = steps_samples(data, rows)
        elif batch_size > 0 and (not self.distinct_rows() or not width or width >= batch_size):
            rows = data.minibatch_rows(ids, draws)
            weight = torch.full((1, 1, 1), 1.0 / batch_size, device=self.device).expand(*rows.shape)
            samples = steps_samples(data, rows)
        else:
            if batch_size > 0:  # fewer samples than a minibatch: each once, weighted by its draws
                rows, weight = data.minibatch_weights(ids, draws, width)
            else:  # the full local data: the same rows at every step
                rows, once = data.full_rows(ids, width)
                weight = once.expand(steps, *once.shape)
            x, y = data.take(rows)  # the same rows at every step: gathered once

            def samples(step: int, which: slice | Tensor) -> tuple[Tensor, Tensor]:
                # every device (a slice): the same tensors each step, so a stacked call cats them once
                return (x, y) if isinstance(which, slice) else (x[which], y[which])

        own = None if cut else self._own_samples(ids, batch_size, epochs)
        numbers = self.step_numbers(seed, rnd, ids, steps, own)

        def at(step: int, which: slice | Tensor) -> tuple[Tensor, ...]:
            x, y = samples(step, which)
            if isinstance(which, slice):  # every device: no indexing (a shared call asks this each step)
                return x, y, weight[step], numbers(step, y.shape[1])
            mine = own and own(step)[which.cpu().numpy()]
            return x, y, weight[step, which], model.randomness(seed, rnd, ids[which], step, y.shape[1], mine)

        return at

    def step_numbers(self, seed: int, rnd: int, ids: Tensor, steps: int, own):
        """(step, batch) -> the dropout numbers of the cohort's local step. Off a CPU several
        steps are drawn in one call (up to DRAWN_AT_ONCE numbers): a step's draw is a couple of
        dozen small kernels, and launched step by step from the host they were most of keyed
        dropout's cost on a GPU (benchmarks/RESULTS.md, "The lent H200"). On a CPU, where a
        draw is bound by its arithmetic in cache-sized blocks, and where devices' samples are
        padded (`own`), a step at a time."""
        model = self.model
        if rng.in_blocks(ids.device) or own is not None or not model.draws_randomness:
            return lambda step, batch: model.randomness(seed, rnd, ids, step, batch, own and own(step))
        drawn: dict[tuple[int, int], Tensor] = {}

        def numbers(step: int, batch: int) -> Tensor:
            if (step, batch) not in drawn:
                together = max(1, DRAWN_AT_ONCE // max(1, len(ids) * model.dropout_numbers(batch)))
                block = range(step, min(steps, step + together))
                drawn.clear()
                drawn.update(zip(((s, batch) for s in block), model.randomness(seed, rnd, ids, block, batch)))
            return drawn[step, batch]
        return numbers

    def _own_samples(self, ids: Tensor, batch_size: int, epochs: float):
        """Where a module draws dropout numbers and a step may pad devices' samples (local epochs'
        last minibatches, unequal full local data): step -> each device's own samples in it
        (int [m], on the host, known from the sizes); else None."""
        if not (self.model.draws_randomness and not self.model.samples_independent and (epochs or batch_size == 0)):
            return None
        sizes = self.data.sizes_np[ids.cpu().numpy()]
        if not epochs:
            return lambda step: sizes
        per_epoch = np.maximum(-(-sizes // batch_size), 1)

        def own(step: int) -> np.ndarray:
            first = (step % per_epoch) * batch_size
            return np.minimum(sizes, first + batch_size) - first
        return own

    def batch_problem(self, batch_size: int = 1, epochs: float = 0.0) -> str:
        sizes = self.data.sizes_np
        # the batched call pads the cohort's full local data to the largest, and an epoch's last,
        # smaller minibatch to the full one: BatchNorm's batch statistics would take in the
        # padding (the loop trains each device on its own rows: fedsim/training/loop.py)
        if batch_size == 0 and self.batch_statistics and sizes.min() != sizes.max():
            return ("its BatchNorm would count the padding of the devices' unequal full local data "
                    "(batch_size = 0) in its batch statistics")
        if epochs and batch_size > 0 and self.batch_statistics and (sizes % batch_size).any():
            return (f"its BatchNorm would count the padding of an epoch's last, smaller minibatch "
                    f"(local_epochs = {epochs:g}) in its batch statistics")
        return self.model.batch_problem()

    def distinct_rows(self) -> bool:
        """Whether a minibatch may be computed as the client's distinct samples weighted by
        their draws (`inputs` with a width under the batch size): the same loss and gradient
        when each sample's output is its own and no dropout mask differs between two draws of it."""
        return self.model.samples_independent and not self.model.draws_randomness

    def step_flops(self, batch: int) -> float:
        return 3.0 * self.model.flops * batch  # the backward pass costs about twice the forward

    def train_flops_per_sample(self) -> float:
        return 2.0 * self.model.train_flops

    def evaluate_flops(self) -> float:
        return float(self.model.flops * min(len(self.data.y_test), chunk_size(self.model, self.device)))

    def data_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data.x, self.data.x_test))

    @property
    def plain_loop_step(self) -> bool:
        return self.model.plain_loop_step

    def step_fn(self) -> StepFn:
        return self.model.step_fn(mean_cross_entropy if self.model.plain_loop_step else weighted_cross_entropy,
                                  batched=False)

    def cohort_step_fn(self) -> StepFn:
        return self.model.step_fn(weighted_cross_entropy, batched=True)


GATHERED_AT_ONCE = 2**22  # bytes of all steps' features up to which `steps_samples` gathers them in one call


def steps_samples(data: ClientData, rows: Tensor) -> Callable[[int, slice | Tensor], tuple[Tensor, Tensor]]:
    """(step, devices) -> the features and labels of `rows` [S, m, B] at that step: gathered
    for all steps in one call where they take at most `GATHERED_AT_ONCE` bytes (a loop's device:
    one gather instead of one a step, 8 us of a 0.3 ms step), step by step otherwise. The same
    values either way."""
    if rows.numel() * data.x[0].numel() * data.x.element_size() > GATHERED_AT_ONCE:
        return lambda step, which: data.take(rows[step, which])
    x, y = data.take(rows)
    return lambda step, which: (x[step, which], y[step, which])


# (each device's samples [N], the floats of the model's state) -> None, or FedsimError when the
# run cannot fit: called before the model's parameters are allocated
Fits = Callable[[np.ndarray, int], None]


def classification_task(dataset: Dataset, data: DataConfig, model: ModelConfig, *, seed: int,
                        device: torch.device, fits: Fits | None = None,
                        rules: int = training_rules.CURRENT) -> ClassificationTask:
    """Partition `dataset` as `[data]` says (a dataset with its own clients: as they are) and
    put it on `device` with the `[model]` network (as training `rules` build it), once `fits`
    accepts its size."""
    owner = dataset.owner_train if dataset.owner_train is not None else partition(dataset.y_train, data, seed)
    clients = ClientData(dataset, owner, data.clients, device)
    shape = input_shape(dataset, model)
    dim = model_dim(model, shape, dataset.n_classes, seed, rules) if fits is not None else None
    if dim is not None:
        fits(clients.sizes_np, dim)
    net = build_model(model, shape, dataset.n_classes, dataset.name, seed, rules)
    return ClassificationTask(clients, net, seed)
