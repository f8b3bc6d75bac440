"""The Strategy interface (server-side algorithm), its context, and the algorithm registry.

The engine only knows this interface: it asks a Strategy whom to invite, from which
parameters each invited device starts, with which learning rate and how many local steps,
and hands it whatever arrived by the deadline (every round, also when nothing arrived).

An algorithm computes its aggregated update Delta and hands it to `apply_update`; the
injected server optimizer (`server_optimizer.py`: sgd, momentum, adam, adagrad, yogi) turns it into the step
taken. With sgd, ``server_lr`` (η_g) scales every algorithm's update: where the spec
(docs/algorithms.md) has η_g this is exactly its role; elsewhere (MIFA, FedLaAvg, fedavg-wait,
amplified, sequential-sgd) it is a plain multiplier that the papers keep at 1, so the default
reproduces them and a comparison can share one value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch import Tensor

from fedsim.algorithms.selection import Selector
from fedsim.algorithms.server_optimizer import ServerOptimizer, ServerOptimizerConfig
from fedsim.config.catalog import ALGORITHMS, SELECTIONS
from fedsim.config import algorithm_options, check_option  # noqa: F401  (algorithm_options: re-exported)
from fedsim.errors import FedsimError, choice_error
from fedsim.training.memory import State
from fedsim.training.objective import PLAIN, LocalObjective


@dataclass
class Arrivals:
    """The updates that reached the server in one round (possibly none): per arrived device its
    id, update, steps, samples, mean training loss, model version, learning rate, and when it
    was invited and arrived (`arrived_at`); and the invited devices whose update did not arrive
    (`missed`), with the seconds the server waited on each (`waited_s`). ``steps`` are the
    local steps each device trained: its full work (`Strategy.local_steps`), or under
    ``[client] work = "fit-deadline"`` those that fitted its deadline (at least one)."""

    ids: np.ndarray  # int64 [k]
    deltas: Tensor  # [k, d] end minus start parameters
    steps: Tensor  # [k] local steps taken
    samples: Tensor  # [k] samples used
    loss: Tensor  # [k] mean training loss
    version: np.ndarray  # int64 [k] round whose model the device started from
    lr: Tensor  # [k] client learning rate each device used
    invited_at: np.ndarray  # float [k] simulated time each device was invited (seen online)
    # [k, d] the parameters each device started from, for a Strategy that `needs_start` (None otherwise):
    # the model a device returns is start + delta
    start: Tensor | None = None
    # float [k] simulated time each update reached the server (None: not told)
    arrived_at: np.ndarray | None = None
    # the round's invitations whose update did not reach the server (dropped, late, surplus):
    # their ids (int64 [m]) and the seconds the server had waited on each when it stopped
    # (the device went offline, or the round closed): what a real server knows of them
    missed: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    waited_s: np.ndarray = field(default_factory=lambda: np.empty(0))

    def __len__(self) -> int:
        return len(self.ids)

    def duration_s(self) -> np.ndarray:
        """Seconds from each arrived device's invitation to its update's arrival (NaN: not told)."""
        if self.arrived_at is None:
            return np.full(len(self.ids), np.nan)
        return np.asarray(self.arrived_at, dtype=np.float64) - self.invited_at

    @staticmethod
    def none(dim: int, device: torch.device) -> "Arrivals":
        """A round in which nothing arrived."""
        empty, ids = torch.empty(0, device=device), np.empty(0, dtype=np.int64)
        return Arrivals(ids=ids, deltas=torch.empty(0, dim, device=device), steps=empty, samples=empty,
                        loss=empty, version=ids, lr=empty, invited_at=np.empty(0))


@dataclass
class Context:
    """What a Strategy may know about the run besides its own state."""

    n_devices: int
    dim: int
    device: torch.device
    seed: int
    server_lr: float
    local_steps: int
    clients_per_round: int  # 0 = every online device
    invite: int  # how many to invite (clients_per_round with overcommit; 0 = all online)
    options: dict[str, Any]
    lr: Callable[[int], float]  # client lr schedule of update round t (1-based)
    client_sizes: np.ndarray  # int [N]
    # true availability probabilities [N] of the trace's round that contains time t, where the
    # trace knows them (round-indexed generators)
    known_p: Callable[[float], np.ndarray] | None = None
    selection: str = ""  # "" = the algorithm's default policy
    # sequential-sgd: `steps` plain SGD steps of size `lr` over the pooled data of all devices,
    # from `params` [d], in round `rnd`; returns end minus start parameters [d].
    train_pooled: Callable[[int, Tensor, int, float], Tensor] | None = None
    # how the aggregated update reaches the model (its lr is server_lr)
    server_optimizer: ServerOptimizerConfig | None = None
    device_steps: np.ndarray | None = None  # [N] each device's steps under [client] local_epochs (None: local_steps)


class Strategy:
    """Base class: FedAvg-shaped defaults that concrete algorithms override where they differ.

    Class attributes: ``name`` (registry key), ``options`` (the algorithm's own config keys with
    typed defaults), ``selection`` (default selection policy), ``state`` (attributes that make
    up the algorithm's state: checkpointed, and counted by ``memory_bytes``; the global model
    ``params`` and the server optimizer's state are always checkpointed), ``needs_start``
    (whether ``aggregate`` reads each arrival's start parameters, ``Arrivals.start``). A state
    value is a Tensor, a numpy array, a number, or a ``DeviceTable``, which also knows whether its rows
    would live on the devices in a deployment (FedAWE's local models, FedLaAvg's last
    gradients): those count in ``device_memory_bytes`` instead of the server's.
    """

    name: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    selection: ClassVar[str] = "uniform"  # with clients_per_round = 0: every online device
    state: ClassVar[tuple[str, ...]] = ("params",)
    # option -> (lowest, highest, whether the lowest is excluded, what it means), checked by `validate`
    ranges: ClassVar[dict[str, tuple]] = {}
    # word-valued option -> its valid words, checked by `validate`
    choices: ClassVar[dict[str, tuple[str, ...]]] = {}
    # whether `aggregate` reads `Arrivals.start` (the asynchronous server then keeps each task's
    # start parameters until it ends, as the device would)
    needs_start: ClassVar[bool] = False
    # whether its rounds invite devices (sequential-sgd trains on the pooled data instead) and
    # choose them through `[algorithm] selection` (fedavg-wait draws its own sample)
    invites_devices: ClassVar[bool] = True
    uses_selection: ClassVar[bool] = True

    params: Tensor
    local_objective: LocalObjective = PLAIN  # terms added to the devices' local loss

    def setup(self, n_devices: int, params: Tensor, ctx: Context) -> None:
        """Called once by the engine: options, selection policy, server optimizer, then
        `init_state`; a subclass overrides `validate` and `init_state`, not this."""
        self.n = n_devices
        self.ctx = ctx
        self.opt = {**self.options, **ctx.options}
        self.validate()
        policy = (ctx.selection if self.uses_selection else "") or self.selection
        self.selection_policy = policy  # (recorded with the run's options: a default may change)
        selector = SELECTIONS.lookup(policy, "[algorithm] selection")
        self.selector: Selector = selector(n_devices, self.budget())
        self.selector.setup(ctx)
        self.server_optimizer = ServerOptimizer(
            ctx.server_optimizer or ServerOptimizerConfig(lr=ctx.server_lr), params)
        if type(self).aggregate is Strategy.aggregate and type(self).receive is Strategy.receive:
            raise FedsimError(f"algorithm {self.name!r} has no aggregate(self, rnd, arrivals), the rule that moves "
                              "the global model each round; define it (docs/extending.md)")
        before = set(vars(self))
        self.init_state(params.detach().clone())
        missing = [name for name in self.state if not hasattr(self, name)]
        if missing:
            raise FedsimError(
                f"algorithm {self.name!r} declares state {missing[0]!r} but has no such attribute "
                "after init_state; set it there (or remove it from `state`) so that checkpoints "
                "keep it")
        unkept = [name for name, value in vars(self).items()
                  if name not in before and name not in (*self.state, "params") and _holds_numbers(value)]
        if unkept:
            raise FedsimError(
                f"algorithm {self.name!r} sets self.{unkept[0]} in init_state, but `state` does not name it: "
                f"checkpoints would not keep it, and a resumed run would start it again as init_state makes "
                f"it; add {unkept[0]!r} to `state` (a constant may be named too)")

    def validate(self) -> None:
        """Check the algorithm's own options (``self.opt``); raise FedsimError on a bad value.
        By default each key of ``ranges`` lies in its range and each of ``choices`` is one of its words."""
        for key, bounds in self.ranges.items():
            check_option(self.name, key, self.opt[key], *bounds)
        for key, words in self.choices.items():
            if self.opt[key] not in words:
                raise choice_error(f"[algorithm] {key}", self.opt[key], words, f"for {self.name!r} is not valid")

    def init_state(self, params: Tensor) -> None:
        """Create the algorithm's state from the initial global model (flat [d])."""
        self.params = params

    def budget(self) -> int:
        """How many devices the selection policy may invite per round (0 = all online)."""
        return self.ctx.invite

    # --- what the engine asks before training -------------------------------------------------
    def select(self, rnd: int, online: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Ids (int64) to invite among the `online` ids."""
        return self.selector(rnd, online, rng)

    def candidates(self, rnd: int, online: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
        """Ids whose current local loss the selection policy asks for before `select`
        (power-of-choice), or None; `answered` hands it the losses of those that reported in time."""
        return self.selector.candidates(rnd, online, rng)

    @property
    def asks_candidates(self) -> bool:
        """Whether rounds ask candidates a question before they invite (power-of-choice, or an
        override of `candidates`): the invited devices' tasks start that much later."""
        selector = getattr(self, "selector", None)
        return type(self).candidates is not Strategy.candidates or (
            selector is not None and type(selector).candidates is not Selector.candidates)

    def answered(self, ids: np.ndarray, losses: np.ndarray) -> None:
        """The candidates that answered in time and their losses [c] (float64), before `select`
        is called with those candidates as the online devices."""
        self.selector.answered(ids, losses)

    def start_params(self, ids: np.ndarray) -> Tensor:
        """The parameters [k, d] each invited device starts from (default: the global model)."""
        return self.params.unsqueeze(0).expand(len(ids), -1)

    def local_objective_of(self, ids: np.ndarray) -> LocalObjective:
        """The terms the trainers add to the local loss of the invited devices `ids`, asked
        when they train: `local_objective`, the same for all, by default; an algorithm with
        per-device terms (SCAFFOLD's, FedDyn's) gives their rows in the order of `ids`."""
        return self.local_objective

    def message_bytes(self) -> tuple[int, int]:
        """Bytes the server sends an invited device and the device sends back: what the
        download and the upload of its task move under model timing. Default: the flat
        float32 model each way (an algorithm that sends more, or compresses, overrides it)."""
        size = 4 * self.params.numel()
        return size, size

    def client_lr(self, rnd: int) -> float:
        """The devices' learning rate in round `rnd` (0-based): the schedule's value at rnd + 1."""
        return self.ctx.lr(rnd + 1)

    def local_steps(self, rnd: int, ids: np.ndarray) -> np.ndarray:
        """Local steps (int64 [k]) of each invited device: `[client] local_steps` by default, or
        its epochs' steps under `[client] local_epochs`; its full work, of which a device trains
        only what fits its deadline under `[client] work = "fit-deadline"`."""
        if self.ctx.device_steps is not None:
            return self.ctx.device_steps[ids]
        return np.full(len(ids), self.ctx.local_steps, dtype=np.int64)

    # --- what the engine checks of a plugin's answers (a built-in's are right by construction) -----
    def invitations(self, rnd: int, choices: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """`select`'s ids (int64), checked for a user's algorithm: distinct ids among `choices`
        (a duplicate would train twice, an offline device count as dropped)."""
        ids = np.asarray(self.select(rnd, choices, rng))
        if (_users(self) or _users(self.selector)) and ids.size:
            wrong = ("not a list of device ids" if ids.ndim != 1 or ids.dtype.kind not in "iu" else
                     f"device {_repeated(ids)} twice" if len(np.unique(ids)) < len(ids) else
                     f"device {ids[~np.isin(ids, choices)][0]}, which was not among the devices it was offered"
                     if not np.isin(ids, choices).all() else "")
            if wrong:
                raise FedsimError(f"algorithm {self.name!r}: select(rnd={rnd}, ...) returned {wrong} ({_shown(ids)}); "
                                  "return distinct int ids among the `online` ids it is given")
        return ids.astype(np.int64)

    def steps_of(self, rnd: int, ids: np.ndarray) -> np.ndarray:
        """`local_steps` (int64 [k]), checked for a user's algorithm: a whole number >= 0 for each id."""
        steps = np.asarray(self.local_steps(rnd, ids))
        if _users(self) and (steps.shape != ids.shape or steps.dtype.kind not in "iuf" or
                               (steps.size and (steps.min() < 0 or not np.array_equal(steps, np.floor(steps))))):
            raise FedsimError(f"algorithm {self.name!r}: local_steps(rnd={rnd}, ids) returned {_shown(steps)} for "
                              f"{len(ids)} devices; return one whole number of steps >= 0 for each id (int64 [k])")
        return steps.astype(np.int64)

    def check_model(self, rnd: int, like: Tensor) -> None:
        """After a user's algorithm aggregated: the global model is still a flat float32 vector
        of `like`'s size on its device (a shape or dtype gone wrong fails far from its cause)."""
        params = getattr(self, "params", None)
        if _users(self) and not (isinstance(params, Tensor) and params.shape == like.shape and
                                   params.dtype == like.dtype and params.device == like.device):
            got = (f"{tuple(params.shape)} {params.dtype} on {params.device}" if isinstance(params, Tensor)
                   else type(params).__name__)
            raise FedsimError(f"algorithm {self.name!r}: after round {rnd}'s aggregate, self.params is {got}, not the "
                              f"flat model ({like.shape[0]},) {like.dtype} on {like.device}; keep it so (e.g. "
                              "self.params + update, not a [k, d] table or .double())")

    # --- what the engine hands back -----------------------------------------------------------
    def receive(self, rnd: int, arrivals: Arrivals) -> None:
        """The engine's entry point after each round: the selection policy learns what arrived
        (a device that dropped did not participate), then the algorithm aggregates."""
        self.selector.learn(rnd, arrivals)
        self.aggregate(rnd, arrivals)

    @classmethod
    def receive_together(cls, runs: list[tuple[Strategy, int, Arrivals]]) -> list[Exception | None] | None:
        """Several runs' `receive(rnd, arrivals)` (each `(strategy, rnd, arrivals)`, all of this
        class) in batched calls, for the runs of a lockstep study on a GPU, where each torch call
        is a kernel launched from the host: once for the group rather than once a run. Each
        run's result must equal its own `receive` to float rounding. Returns each run's
        exception (None: it received; `each_run` keeps a run's failure its own), or None, having
        done nothing, where it cannot (the default: each run then receives on its own)."""
        return None

    def aggregate(self, rnd: int, arrivals: Arrivals) -> None:
        """The algorithm's rule, every round (also when nothing arrived): compute the
        aggregated update and hand it to `apply_update`. Every algorithm implements it."""
        raise NotImplementedError

    def refuse(self, rnd: int) -> None:
        """A round the server failed for its quorum (`[server] update_frac`): its updates are
        discarded and the model must not move. By default the algorithm sees a round in which
        nothing arrived (absences count, round indices move on); an algorithm that steps even
        then (MIFA, FedLaAvg) overrides this (docs/algorithms.md, "Rounds without an update")."""
        self.receive(rnd, Arrivals.none(self.params.shape[0], self.ctx.device))

    def server_step(self, delta: Tensor) -> Tensor:
        """The change the server optimizer makes for the aggregated update `delta` [d]."""
        return self.server_optimizer.step(delta)

    def apply_update(self, delta: Tensor) -> None:
        """x <- x + server_step(delta): how an algorithm moves the global model."""
        self.params = self.params + self.server_step(delta)

    def metrics(self) -> dict[str, float]:
        """Algorithm-specific numbers recorded with the round (same keys every round)."""
        return {}

    # --- checkpoints and the price of the state ---------------------------------------------
    def options_in_use(self) -> dict[str, Any]:
        """Every option this run's algorithm and selection policy use, defaults included, and the
        policy's name: what a resume keeps, so that a release with other defaults goes on with
        the run's own (checkpoint.pt and manifest.json record it)."""
        return {"algorithm": {**getattr(self.selector, "opt", {}), **self.opt}, "selection": self.selection_policy}

    def state_names(self) -> list[str]:
        """`state`, with the global model first unless it is derived from the state (FedAWE's
        mean of the local models): what checkpoints keep and memory_bytes counts."""
        derived = isinstance(getattr(type(self), "params", None), property)
        return list(dict.fromkeys(self.state if derived else ("params", *self.state)))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the state, the selection policy's and the optimizer's."""
        sd = {name: _save(getattr(self, name)) for name in self.state_names()}
        sd["selector"] = self.selector.state_dict()
        sd["server_optimizer"] = {k: _save(v) for k, v in self.server_optimizer.state_dict().items()}
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore what `state_dict` kept (on resume), on this run's device."""
        for name in self.state_names():
            current, value = getattr(self, name), sd[name]
            if hasattr(current, "load_state_dict"):
                current.load_state_dict(value)
            elif isinstance(value, Tensor):
                setattr(self, name, value.to(self.ctx.device))
            elif isinstance(value, np.ndarray):
                setattr(self, name, value.copy())
            else:
                setattr(self, name, value)
        self.selector.load_state_dict(sd["selector"])
        if "server_optimizer" in sd:  # (checkpoints of fedsim before server optimizers had none)
            self.server_optimizer.load_state_dict(sd["server_optimizer"], self.ctx.device)

    def memory_bytes(self) -> int:
        """Bytes the server keeps between rounds (the spec's memory column)."""
        own = sum(_nbytes(getattr(self, name), "server") for name in self.state_names())
        return (own + sum(_nbytes(v, "server") for v in self.selector.state_dict().values())
                + self.server_optimizer.memory_bytes())

    def device_memory_bytes(self) -> int:
        """Bytes the devices keep for the algorithm, all devices together (simulated here)."""
        return sum(_nbytes(getattr(self, name), "device") for name in self.state_names())


def planned_state(name: str, ctx: Context, origin: str = "") -> State:
    """What algorithm `name` would keep for `ctx`'s devices and model, measured by setting it up
    on the meta device, which allocates no tensor: its state on this machine (the server's and
    the devices' rows alike, which the simulation holds here), named by its largest part (MIFA's
    table of every device's update). Empty where it cannot be set up there (its own checks then
    speak when it is set up for real)."""
    strategy = make_strategy(name, origin)
    meta = dataclasses.replace(ctx, device=torch.device("meta"))
    try:
        strategy.setup(ctx.n_devices, torch.zeros(ctx.dim, device=meta.device), meta)
    except (FedsimError, RuntimeError, NotImplementedError):
        return State()
    sizes = {part: _nbytes(getattr(strategy, part), "server") + _nbytes(getattr(strategy, part), "device")
             for part in strategy.state_names()}
    total = strategy.memory_bytes() + strategy.device_memory_bytes()
    largest = max(sizes, key=sizes.get)
    rows = getattr(getattr(strategy, largest), "rows", getattr(strategy, largest))
    if isinstance(rows, Tensor) and rows.dim() == 2:
        part = f"its {largest} of {rows.shape[0]:,} devices x {rows.shape[1]:,} parameters"
    else:
        part = f"its {largest} of {rows.numel():,} floats" if isinstance(rows, Tensor) else f"its {largest}"
    return State(f"{strategy.name}'s state ({part})", total)


def _save(value: Any) -> Any:
    if hasattr(value, "state_dict"):
        return value.state_dict()
    if isinstance(value, (Tensor, np.ndarray)):
        return value.clone() if isinstance(value, Tensor) else value.copy()
    return value


def _nbytes(value: Any, side: str) -> int:
    if hasattr(value, "server_bytes"):
        return value.server_bytes() if side == "server" else value.device_bytes()
    if side == "device":
        return 0
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return value.nbytes
    return 0


def each_run(runs: list[tuple], errors: list[Exception | None], step: Callable) -> list:
    """`step(*run)` for each of `runs` that has not failed yet (`errors`), and what each returned
    (None for a failed run): a run whose step raises keeps its exception in `errors` and takes no
    further part, as a run alone would stop there (a batched step's per-run parts)."""
    found = []
    for i, run in enumerate(runs):
        value = None
        if errors[i] is None:
            try:
                value = step(*run)
            except Exception as error:  # (the run's own failure: the lockstep driver fails that run)
                errors[i] = error
        found.append(value)
    return found


def steps_together(strategy: Strategy, aggregate: Callable) -> bool:
    """Whether a run's round is `aggregate` (its class's rule, not a subclass's other one) and an
    sgd server step, which a batched `receive_together` of several runs may take for it."""
    cls = type(strategy)
    return (strategy.server_optimizer.cfg.name == "sgd" and cls.aggregate is aggregate
            and cls.receive is Strategy.receive and cls.apply_update is Strategy.apply_update
            and cls.server_step is Strategy.server_step)


def apply_updates_together(strategies: list[Strategy], updates: Tensor) -> Tensor:
    """`apply_update(updates[r])` of several runs whose server optimizer is sgd, in one call:
    x <- x + server_lr * update for each (to float rounding: a lockstep group's runs); the steps
    taken [runs, d]."""
    lr = torch.tensor([s.server_optimizer.cfg.lr for s in strategies], dtype=updates.dtype)
    steps = lr.to(updates.device).unsqueeze(1) * updates
    for strategy, params in zip(strategies, torch.stack([s.params for s in strategies]) + steps):
        strategy.params = params
    return steps


def padded_rows(sizes: list[int], rows: Tensor) -> Tensor:
    """Runs' rows [sum(sizes), ...], run after run, as [runs, k, ...], k the most rows of a run, a
    run with fewer padded with zeros. No sum over a run's k rows reaches another run's
    (deterministic on a GPU, and one run's inf stays its own, as a summing matrix over all rows
    would not keep it)."""
    k, runs = max(sizes), len(sizes)
    if min(sizes) == k:
        return rows.view(runs, k, *rows.shape[1:])
    run = torch.as_tensor(np.repeat(np.arange(runs), sizes), device=rows.device)
    slot = torch.as_tensor(np.concatenate([np.arange(n) for n in sizes]), device=rows.device)
    padded = rows.new_zeros((runs, k, *rows.shape[1:]))
    padded[run, slot] = rows
    return padded


def run_means(sizes: list[int], rows: Tensor) -> Tensor:
    """Each run's mean of its rows [runs, ...] (`rows`: run after run, `sizes` of each)."""
    counts = torch.tensor(sizes, dtype=rows.dtype).to(rows.device)
    return padded_rows(sizes, rows).sum(1) / counts.view(-1, *[1] * (rows.dim() - 1))


def rows_of_runs(sizes: list[int], device: torch.device) -> Tensor:
    """Each row's run (int64 [sum(sizes)]), rows run after run: to give each row its run's value."""
    return torch.as_tensor(np.repeat(np.arange(len(sizes)), sizes), device=device)


def weighted_sum(deltas: Tensor, weights: Tensor) -> Tensor:
    """Σ_i w_i Δ_i over the rows of ``deltas`` [k, d] (one matrix-vector product)."""
    return weights.to(deltas.dtype) @ deltas


def nan_stats(values: np.ndarray) -> tuple[float, float]:
    """(mean, max) of a possibly empty array; NaN when empty, so metric keys never change."""
    if len(values) == 0:
        return math.nan, math.nan
    return float(np.mean(values)), float(np.max(values))


def check_range(strategy: Strategy, key: str, low: float, high: float = math.inf, *,
                low_open: bool = False, why: str = "") -> None:
    """FedsimError unless ``low <(=) opt[key] <= high``: one line naming the key and the fix."""
    check_option(strategy.name, key, strategy.opt[key], low, high, low_open, why)


# the built-ins are listed in fedsim/config/catalog.py; plugins are found as "module:Class" or entry
# points of `fedsim.algorithms`; `register` adds a class defined in the user's own script
def is_strategy(obj: Any) -> bool:
    """What fedsim.config.catalog.ALGORITHMS accepts: a Strategy subclass."""
    return isinstance(obj, type) and issubclass(obj, Strategy)


REGISTRY = ALGORITHMS


def register(cls: type[Strategy]) -> type[Strategy]:
    return ALGORITHMS.register(cls.name, cls)


def _users(obj: Any) -> bool:
    """Whether `obj`'s class is a user's (a plugin's), not one of fedsim's own."""
    return type(obj).__module__.split(".")[0] != "fedsim"


def _repeated(ids: np.ndarray) -> int:
    values, counts = np.unique(ids, return_counts=True)
    return int(values[counts > 1][0])


def _shown(values: np.ndarray) -> str:
    """A few of a plugin's returned values, on one line."""
    flat = np.ravel(values)
    return str(flat[:6].tolist())[:-1] + (", ...]" if flat.size > 6 else "]")


def _holds_numbers(value: Any) -> bool:
    """Whether an attribute holds numbers a checkpoint must keep: a tensor or array of more
    than one number, or a table of them (an empty one is a metric's placeholder)."""
    if isinstance(value, (Tensor, np.ndarray)):
        return (value.numel() if isinstance(value, Tensor) else value.size) > 1
    return callable(getattr(value, "state_dict", None))


def make_strategy(name: str, origin: str = "") -> Strategy:
    strategy = ALGORITHMS.lookup(name, f"{origin}: [algorithm] name" if origin else "[algorithm] name")()
    strategy.name = name  # as the config names it (a plugin's 'module:Class'), in its error lines
    return strategy


__all__ = ["Arrivals", "Context", "Strategy", "register", "algorithm_options", "make_strategy", "planned_state",
           "REGISTRY", "apply_updates_together", "each_run", "padded_rows", "rows_of_runs", "run_means",
           "steps_together", "weighted_sum", "nan_stats", "check_range"]
