"""Typed run configuration: TOML file + ``--set section.key=value`` overrides, validated.

Every key a user can write is a dataclass field below (or an option declared by the chosen
trace generator / algorithm), so unknown keys and wrong types are caught before anything
runs, with the closest valid key suggested. Each field is declared by `key`, which keeps its
meaning and the rules of its value beside it: the checks, the error lines and
``fedsim config show`` all read them from there.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fedsim.config.catalog import (ALGORITHM_CHOICES, ALGORITHM_OPTIONS, ALGORITHM_RANGES, ALGORITHMS, BUILT_IN_ALGORITHMS,
                                   BUILT_IN_MODELS, GENERATORS, MODELS,
                                   SELECTION_OPTIONS, SELECTION_RANGES,
                                   PARTITIONS, SCHEDULES, SELECTIONS, TRACE_SELECTIONS, TRAINERS,
                                   BUILT_IN_SELECTIONS)
from fedsim.errors import FedsimError, choice_error, did_you_mean
from fedsim.config.registry import Registry


@dataclass(frozen=True)
class Rule:
    """What one key means and what values it takes (one field's metadata, see `key`).

    ``positive``: > 0 (integers: >= 1); ``non_negative``: >= 0; ``within``: (low, high, low
    included, high included); ``choices``: a tuple or closed registry of the valid words;
    ``zero``: what the empty value (0, "" or []) means, said in the errors and comments, and
    for a key with choices, "" is then valid too; ``word``: (word, its meaning), the word
    accepted instead of a whole number >= 1; ``names``: the valid names of an open registry,
    listed in comments only (the registry checks them when it looks them up); ``check``:
    (where, value) -> value for a rule of its own, raising FedsimError.
    """

    meaning: str
    positive: bool = False
    non_negative: bool = False
    within: tuple[float, float, bool, bool] | None = None
    choices: tuple | Registry | None = None
    zero: str = ""
    word: tuple[str, str] | None = None
    text: str = ""  # a number key that also takes text, and what the text is
    names: Callable[[], list[str]] | None = None
    check: Callable[[str, Any], Any] | None = None

    def choice_names(self) -> list[str]:
        return self.choices.names() if isinstance(self.choices, Registry) else list(self.choices)

    def describe(self, default: Any) -> str:
        """The meaning and the rule in words, for the comment beside the key."""
        rules = []
        if self.positive:
            rules.append(">= 1" if isinstance(default, int) else "> 0")
        if self.non_negative:
            rules.append(">= 0")
        if self.within:
            rules.append(f"in {_interval(self.within)}")
        if self.choices is not None:
            rules.append("one of: " + ", ".join(self.choice_names()))
        if self.names is not None:
            rules.append(", ".join(self.names()) + ", or a plugin's 'module:Name'")
        if self.word:
            rules.append(f'"{self.word[0]}" = {self.word[1]}, or a number >= 1')
        if self.zero:  # (a number's, where a word like "auto" is the default)
            rules.append(f"{'0' if self.non_negative else _empty(default)} = {self.zero}")
        return self.meaning + (f" ({'; '.join(rules)})" if rules else "")


def key(default: Any, meaning: str, **rules: Any) -> Any:
    """A config field: its default, a one-line meaning and its rules (the `Rule` arguments)."""
    metadata = {"rule": Rule(meaning, **rules)}
    if isinstance(default, (list, dict)):
        return field(default_factory=default.copy, metadata=metadata)
    return field(default=default, metadata=metadata)


def rule(f: dataclasses.Field) -> Rule:
    """The rule of a config field."""
    return f.metadata["rule"]


def _seed(where: str, seed: int) -> int:
    """A run's seed: torch keeps 32 bits of the seed that draws a model's initial weights, so
    seeds 2**32 apart would start from one model."""
    if seed >= 2**32:
        raise FedsimError(f"{where} = {seed} must be below 2**32 = {2**32} (torch draws the model's initial weights "
                          "from 32 bits of the seed, so seeds 2**32 apart would start from one model)")
    return seed


def _interval(within: tuple[float, float, bool, bool]) -> str:
    low, high, low_in, high_in = within
    return f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def _empty(default: Any) -> str:
    """How the empty value of a key's type is written: 0, "" or []."""
    return {str: '""', list: "[]"}.get(type(default), "0")


def plain_folder_name(name: Any) -> bool:
    """Whether `name` names one folder: not empty, not . or .., no '/' or '\\', no line
    breaks, tabs or other characters that do not print (a run's and a study's name alike)."""
    return (isinstance(name, str) and bool(name.strip()) and name not in (".", "..") and "/" not in name
            and "\\" not in name and name.isprintable())


def _folder_name(where: str, value: str) -> str:
    if not plain_folder_name(value):
        raise FedsimError(
            f"{where} = {value!r} is not a folder name; give a plain name without '/', '\\' or line breaks "
            "(the run directory is [run] out / name; put the parent folders in [run] out)"
        )
    return value


def _target_vectors(where: str, value: Any) -> Any:
    """Lists of finite numbers, all of one length."""
    for k, vector in enumerate(value):
        numbers = isinstance(vector, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vector)
        if not numbers or not vector:
            raise FedsimError(f"{where}: entry {k + 1} = {vector!r} is not a list of finite numbers; give "
                              "one vector per client, e.g. targets = [[1.0, 0.0], [0.0, 2.0]]")
        if len(vector) != len(value[0]):
            raise FedsimError(f"{where}: entry {k + 1} has {len(vector)} numbers but entry 1 has "
                              f"{len(value[0])}; give vectors of one dimension")
    return value


def _auto(where: str, value: Any) -> Any:
    """The one word a number key with `text` takes: "auto"."""
    if isinstance(value, str) and value != "auto":
        raise FedsimError(f'{where} = {value!r} must be "auto" or a number >= 0 (0 = off)')
    return value


def _offset(where: str, value: Any) -> Any:
    """A number of seconds, or an ISO 8601 date-time (resolved against the trace's origin)."""
    if isinstance(value, str):
        try:
            datetime.datetime.fromisoformat(value)
        except ValueError:
            raise FedsimError(f"{where} = {value!r} is not a date-time; give seconds into the trace "
                              "or an ISO 8601 date-time like '2024-03-04T08:00:00+00:00'") from None
    return value


def _distinct_names(where: str, value: list) -> list:
    for name in value:
        if not isinstance(name, str):
            raise FedsimError(f"{where}: algorithm names must be strings, got {name!r}")
    repeated = next((name for i, name in enumerate(value) if name in value[:i]), None)
    if repeated is not None:
        raise FedsimError(
            f"{where} lists {repeated!r} more than once; name each algorithm once "
            "(each one runs into a sub-folder named after it)"
        )
    return value


def _at_most(limit: int):
    """A bound no run needs: above it a value is a typo, or memory that cannot be had."""
    def check(where: str, value: int) -> int:
        if value > limit:
            raise FedsimError(f"{where} = {value} is more than any run needs (at most {limit:,})")
        return value
    return check


# the work a run may ask for (docs/running.md, "How much work a run may ask for"): the local
# steps of one device's task (each step's randomness is drawn up front), and of the whole run
# (rounds x devices a round x steps a task: days of work on any machine)
MAX_TASK_STEPS = 100_000
MAX_RUN_STEPS = 10**12


def _epochs(where: str, value: float) -> float:
    """Every epoch is at least one minibatch: more epochs than a task's steps cannot run."""
    if value > MAX_TASK_STEPS:
        raise FedsimError(f"{where} = {value:g} means at least {math.ceil(value):,} local steps a task (an epoch "
                          f"is at least one minibatch), more than the {MAX_TASK_STEPS:,} a task may take; lower it")
    return value


TRACKERS = ("tensorboard", "mlflow")


def _trackers(where: str, value: list) -> list[str]:
    for name in value:
        if name not in TRACKERS:
            raise choice_error(where, name, list(TRACKERS), "is not a tracker")
    return list(dict.fromkeys(value))


def _accuracies(where: str, value: list) -> list[float]:
    for entry in value:
        number = isinstance(entry, (int, float)) and not isinstance(entry, bool)
        if not (number and 0 < entry <= 1):
            raise FedsimError(f"{where}: {entry!r} is not an accuracy in (0, 1]; give fractions like 0.8")
    return [float(entry) for entry in value]


DEVICE_MODELS = ("profiles", "constant", "lognormal", "halfnormal", "table")


def _device_classes(where: str, value: list) -> list:
    from fedsim.sim.profiles import NAMES

    for name in value:
        if name not in NAMES:
            raise choice_error(where, name, list(NAMES), "is not a device class")
    repeated = next((name for i, name in enumerate(value) if name in value[:i]), None)
    if repeated is not None:
        raise FedsimError(f"{where} lists {repeated!r} more than once; name each class once")
    return value


def _class_weights(where: str, value: list) -> list[float]:
    numbers = all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w >= 0
                  for w in value)
    if not numbers or (value and sum(value) <= 0):
        raise FedsimError(f"{where} = {value!r} must be shares >= 0 with a positive sum, one per class")
    return [float(w) for w in value]


@dataclass
class RunConfig:
    """What the run is called, where it writes, how long it goes and how it is watched."""

    name: str = key("run", "name of the run directory under out (a plain folder name)",
                    check=_folder_name)
    out: str = key("runs", "folder that holds the run directories")
    seed: int = key(0, "seed of every random draw (partition, trace, devices, training; below 2**32)",
                    non_negative=True, check=lambda where, seed: _seed(where, seed))
    rounds: int = key(100, "rounds to run", positive=True)
    max_time: float = key(0.0, "simulated seconds before the run stops", non_negative=True,
                          zero="no limit")
    eval_every: int = key(10, "rounds between evaluations on the test split", positive=True)
    device: str = key("auto", "torch device (auto: cuda when torch sees a GPU, else cpu)",
                      choices=("auto", "cpu", "cuda"))
    threads: str | int = key("auto", "torch intra-op threads of each call",
                             word=("auto", "chosen by each call's work"))
    deterministic: bool = key(True, "on a GPU, cuDNN's deterministic kernels: a seed gives the same run bit "
                              "for bit (false: its fastest, benchmarked; runs then differ by float rounding)")
    tf32: bool = key(False, "on a GPU, matmuls and convolutions in TF32 on tensor cores (10-bit mantissa, "
                     "PyTorch's default for convolutions): faster, less exact")
    algorithms: list = key([], "algorithms run side by side on the same trace, data and seed",
                           zero="only [algorithm] name", check=_distinct_names)
    checkpoint_every: int = key(0, "rounds between checkpoints", non_negative=True,
                                zero="only at the end")
    events: str = key("all", "rows of events.parquet: every invitation, only those whose outcome is neither "
                      "arrived nor answered, or none (the report then says what it cannot show)",
                      choices=("all", "failures", "none"))
    progress: bool = key(True, "show a progress bar")
    plots: bool = key(True, "draw the plots into plots/ at the end (fedsim plot draws them later)")
    diverge_loss: float | str = key("auto", "a training loss above which the run counts as diverged",
                                    non_negative=True, zero="off", check=_auto,
                                    text='"auto" = 1000 x the initial model\'s loss')
    targets: list = key([], "test accuracies whose time-to-target the report and the end-of-run "
                        "table show (fractions in (0, 1])", check=_accuracies)
    trackers: list = key([], "experiment trackers that get every round's metrics: tensorboard "
                         "(RUN/tensorboard/), mlflow (MLFLOW_TRACKING_URI, else run.out/mlruns)",
                         check=_trackers, zero="none")


@dataclass
class DataConfig:
    """The dataset and how it is split among the clients (one client per device)."""

    dataset: str = key("digits", "dataset to train on (digits, fashion-mnist, mnist, cifar10, cifar100, svhn, "
                       "femnist, shakespeare, sent140, parquet, quadratic or logistic)")
    root: str = key("", "folder of the dataset's files", zero="the dataset's default location")
    download: bool = key(False, "download a missing fashion-mnist, mnist, cifar10, cifar100 or svhn into root")
    clients: int = key(100, "number of clients, one per device", positive=True)
    partition: str = key("", "how the data is split among clients", choices=PARTITIONS,
                         zero="natural (one device per user) for femnist, shakespeare, sent140 and "
                              "parquet; iid otherwise")
    users: str = key("first", "natural partition: which [data] clients users become devices when the "
                     "dataset has more", choices=("first", "most-samples"))
    vocab_size: int = key(10000, "sent140 / parquet texts: words kept (the most frequent; the "
                          "others read as unknown)", positive=True)
    client_column: str = key("", "parquet: the column of each row's client")
    label_column: str = key("", "parquet: the column of each row's label (integers from 0, or strings)")
    feature_column: str = key("", "parquet: the column of each row's feature (an image, numbers or a text)")
    tokens: str = key("words", "parquet: how a text feature is split into tokens",
                      choices=("words", "characters"))
    alpha: float = key(0.5, "dirichlet partition: concentration (smaller = more skewed)",
                       positive=True)
    classes_per_client: int = key(2, "classes partition: distinct classes per client",
                                  positive=True)
    size_sigma: float = key(0.3, "one-class partition: relative spread of the normal client sizes",
                            non_negative=True)
    majority: float = key(0.95, "majority partition: fraction of a client's samples with its "
                          "majority label", within=(0.0, 1.0, True, True))
    test_fraction: float = key(0.25, "fraction held out for testing by datasets without a test "
                               "split (digits, logistic; parquet without test files: per client)", within=(0.0, 1.0, False, False))
    targets: list = key([], "quadratic: one target vector per client",
                        zero="drawn at random, of dimension dim", check=_target_vectors)
    dim: int = key(2, "quadratic / logistic: dimension when no targets are given", positive=True,
                   check=_at_most(10_000_000))
    noise: float = key(0.0, "quadratic: std of the gradient noise", non_negative=True)
    samples: int = key(5000, "logistic: number of synthetic samples (train + test)", positive=True,
                       check=_at_most(100_000_000))
    classes: int = key(10, "logistic: number of classes", positive=True)


@dataclass
class ModelConfig:
    """The model every client trains (the quadratic task reads only init and init_from)."""

    name: str = key("logreg", "model architecture", names=MODELS.names)
    hidden: int = key(64, "mlp: width of the hidden layer", positive=True)
    dropout: float = key(0.0, "dropout before every dense layer that reads a learned "
                         "representation (cnn-cinic: 0.2 unless given)", within=(0.0, 1.0, True, False))
    word_vectors: str = key("", "lstm on text: a GloVe text file whose vectors are the fixed "
                            "word embedding (its size sets the embedding's)",
                            zero="a learned embedding of 25 (lstm) or 8 (char-lstm) numbers")
    init: list = key([], "quadratic: the starting point x0", zero="zeros")
    init_from: str = key("", "start from a run's saved model.pt, or the run directory holding it "
                         "(looked up in the working directory, then beside the config)",
                         zero="the task's own seeded initialisation")
    local_buffers: bool = key(False, "an nn.Module's buffers (BatchNorm's running statistics) stay on each "
                              "device (FedBN) instead of being averaged with the weights")
    train_flops_per_sample: float = key(0.0, "the model's training FLOPs per sample (3 x forward) that the "
                                        "device clock uses", non_negative=True,
                                        zero="counted on one forward pass at build time")
    options: dict = key({}, "a model plugin's own keys (its factory's `options`), written as further [model] keys")


@dataclass
class TraceConfig:
    """When each device is online: a trace file, or a generator with its own keys."""

    source: str = key("always", "where the availability comes from: a trace file or a generator",
                      names=lambda: ["file", *GENERATORS.names()])
    path: str = key("", 'the trace file of source = "file" (looked up in the working directory, '
                    "then beside the config)")
    days: float = key(0.0, "wall-clock generators: days of trace", non_negative=True,
                      zero="long enough for the run")
    devices_table: str = key("", "a device table (Parquet, one row per trace device): class, "
                             "speeds, tz_offset, group, ...; recorded in devices.parquet and read by "
                             "[devices] (docs/timing.md)", zero="none")
    offset: float | str = key(0.0, "where in the trace the run starts: seconds after its t = 0, or "
                              "a date-time when the trace has an origin", non_negative=True,
                              text="an ISO 8601 date-time", check=_offset)
    select: str = key("", "which trace devices the run's [data] clients replay when the trace "
                      "has more", choices=TRACE_SELECTIONS,
                      zero="none: the trace has exactly [data] clients devices")
    options: dict = key({}, "the generator's own keys, written as further [trace] keys")


@dataclass
class ServerConfig:
    """How the server invites devices, waits for them and times its rounds."""

    mode: str = key("sync", "sync: rounds; async: buffered aggregation (FedBuff-style)",
                    choices=("sync", "async"))
    clients_per_round: int = key(0, "devices invited per round (K), at most [data] clients",
                                 non_negative=True, zero="every online device")
    overcommit: float = key(0.0, "invite ceil(K * (1 + overcommit)), keep the first K",
                            non_negative=True)
    deadline: float = key(600.0, "seconds after the invitations (the round's start, after any min_selected "
                          "wait; async: each task's) after which a device is late", positive=True)
    timing: str = key("model", "model: simulated transfers and compute; ideal: the papers' "
                      "round model", choices=("model", "ideal"))
    round_duration: float = key(60.0, "ideal timing: round r spans [r*D, (r+1)*D); also the slot "
                                "of round-indexed generators", positive=True)
    deadline_sigma: float = key(0.0, "the round's deadline is drawn each round from N(deadline, "
                                "deadline_sigma), clipped at 0 (FLASH)", non_negative=True,
                                zero="the same deadline every round")
    min_selected: int = key(0, "a round starts only when at least this many devices are online "
                            "(FLASH); the wait is part of the round", non_negative=True,
                            zero="as soon as anyone is online")
    update_frac: float = key(0.0, "quorum: a round with fewer arrivals than ceil(update_frac x "
                             "invited) is failed and the model is not updated (FLASH)",
                             within=(0.0, 1.0, True, True), zero="no quorum")
    buffer: int = key(10, "async: aggregate every `buffer` arrivals", positive=True)
    concurrency: int = key(20, "async: devices kept training", positive=True)


WORK_MODES = ("full", "fit-deadline")  # [client] work: how much of its local work an invited device does


@dataclass
class ClientConfig:
    """Local training on each device."""

    local_steps: int = key(5, "local SGD steps per round (at most 100,000: no run needs more, and each "
                           "step's randomness is drawn up front)", positive=True, check=_at_most(MAX_TASK_STEPS))
    local_epochs: float = key(0.0, "passes over each device's own data per round instead: its samples "
                              "shuffled once per epoch and cut into minibatches of batch_size (the last "
                              "smaller): local_epochs x ceil(n_i / batch_size) steps, rounded up, for a "
                              "device of n_i samples (at most 100,000 steps for the largest device)", non_negative=True,
                              check=_epochs, zero="local_steps steps of minibatches drawn with replacement")
    batch_size: int = key(32, "minibatch size (at most 1,000,000)", non_negative=True, zero="the full local data",
                          check=_at_most(1_000_000))
    lr: float = key(0.05, "client learning rate", positive=True)
    lr_schedule: str = key("constant", "how the client learning rate changes over rounds",
                           choices=SCHEDULES)
    lr_step_every: int = key(100, "step schedule: rounds between decays", positive=True)
    lr_step_gamma: float = key(0.5, "step schedule: decay factor (a decay: at most 1)",
                               within=(0.0, 1.0, False, True))
    weight_decay: float = key(0.0, "L2 penalty added to each step's gradient, like torch's SGD",
                              non_negative=True)
    clip: float = key(0.0, "max gradient L2 norm per step", non_negative=True, zero="off")
    trainer: str = key("auto", "batched: the whole cohort in one computation; loop: one device "
                       "at a time; auto: the faster for the model and device", choices=TRAINERS)
    cuda_graphs: bool = key(True, "on a GPU, replay each local step of the batched path from a CUDA graph "
                            "captured once per cohort shape (false: launch every kernel eagerly)")
    compile: bool = key(True, "on a GPU, an LSTM's cell arithmetic compiled (torch.compile) into fused "
                        "kernels, forward and backward (false: a dozen kernels per time step)")
    work: str = key("full", "full: every invited device trains all of its local steps; fit-deadline: "
                    "only the steps that fit before the deadline at its own speed (at least one), as "
                    "FedProx's and FedNova's variable local work (model timing; docs/timing.md)",
                    choices=WORK_MODES)


@dataclass
class AlgorithmConfig:
    """The federated algorithm, and the server optimizer that applies its update."""

    name: str = key("fedavg", "the algorithm to run", names=ALGORITHMS.names)
    server_lr: float = key(1.0, "server learning rate", positive=True)
    server_optimizer: str = key("sgd", "how the aggregated update reaches the model",
                                choices=("sgd", "momentum", "adam", "adagrad", "yogi"))
    server_momentum: float = key(0.9, "momentum: m <- momentum * m + g",
                                 within=(0.0, 1.0, True, False))
    server_beta1: float = key(0.9, "adam, adagrad, yogi (FedAdam, FedAdagrad, FedYogi): first-moment decay",
                              within=(0.0, 1.0, True, False))
    server_beta2: float = key(0.99, "adam, yogi: second-moment decay", within=(0.0, 1.0, True, False))
    server_eps: float = key(1e-3, "adam, adagrad, yogi: tau, added to sqrt(v)", positive=True)
    selection: str = key("", "whom the server invites among the online devices",
                         names=SELECTIONS.names, zero="the algorithm's default policy")
    options: dict = key({}, "the algorithm's own keys, written as further [algorithm] keys")


@dataclass
class DevicesConfig:
    """How long each device takes to download, train and upload (model timing; docs/timing.md)."""

    model: str = key("profiles", "profiles: device classes with FLOP/s, links and latency, compute "
                     "from the model's cost; constant: every device at the medians below; "
                     "lognormal: spread around them; halfnormal: compute seconds with a half-normal tail above "
                     "seconds_per_sample (FLSim's FedBuff setup); table: [trace] devices_table",
                     choices=DEVICE_MODELS)
    classes: list = key([], "profiles: the device classes to draw from", check=_device_classes,
                        zero="every built-in class (docs/timing.md)")
    class_weights: list = key([], "profiles: the share of each of classes", check=_class_weights,
                              zero="the classes' built-in shares")
    step_overhead_s: float = key(0.0, "seconds a device spends per local step on top of its "
                                 "samples' compute (any model)", non_negative=True)
    seconds_per_sample: float = key(0.002, "constant, lognormal: median compute seconds per "
                                    "training sample; halfnormal: the fastest device's", non_negative=True)
    bandwidth_bps: float = key(1.0e6, "constant, lognormal: median link speed, bits per second, "
                               "both directions", positive=True)
    latency_s: float = key(0.1, "constant, lognormal, table (without its latency_s column): "
                           "seconds of latency per transfer", non_negative=True)
    compute_sigma: float = key(0.5, "lognormal: spread of seconds_per_sample across devices; "
                               "halfnormal: the tail's scale, in units of seconds_per_sample", non_negative=True)
    bandwidth_sigma: float = key(0.5, "lognormal: spread of bandwidth across devices",
                                 non_negative=True)


# the [devices] keys that only some timing models read: set under another model, they would
# be ignored, so they are refused (an earlier fedsim's default model was lognormal)
DEVICE_MODEL_KEYS = {"classes": ("profiles",), "class_weights": ("profiles",),
                     "seconds_per_sample": ("constant", "lognormal", "halfnormal"),
                     "bandwidth_bps": ("constant", "lognormal", "halfnormal"),
                     "latency_s": ("constant", "lognormal", "halfnormal", "table"),
                     "compute_sigma": ("lognormal", "halfnormal"), "bandwidth_sigma": ("lognormal",)}


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    source: str = "<defaults>"  # where it came from, for error messages
    origins: dict = field(default_factory=dict, repr=False, compare=False)  # (section, key) -> where set

    def to_dict(self) -> dict:
        """Plain nested dict, with generator/algorithm options folded back into their sections."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name in ("source", "origins"):
                continue
            section = dataclasses.asdict(getattr(self, f.name))
            section.update(section.pop("options", {}))
            out[f.name] = section
        return out

    def where(self, section: str, key: str) -> str:
        """`SOURCE: [section] key`, SOURCE where the key was set (a `--set`, a base, the file):
        what a line about its value starts with."""
        return f"{self.origins.get((section, key), self.source)}: [{section}] {key}"

    def with_algorithm(self, name: str) -> "Config":
        """A copy running `name` (options of the configured algorithm that `name` lacks are dropped)."""
        valid = algorithm_options(name) | selection_options(self.algorithm.selection)
        algo = dataclasses.replace(
            self.algorithm,
            name=name,
            options={k: v for k, v in self.algorithm.options.items() if k in valid},
        )
        return dataclasses.replace(self, algorithm=algo, run=dataclasses.replace(self.run, algorithms=[]))


# what a resumed run may change: how long it goes on and how it is watched, never what is
# simulated (that would silently mix two experiments in one run directory)
RESUME_KEYS = ("run.rounds", "run.max_time", "run.eval_every", "run.checkpoint_every",
               "run.progress", "run.device", "run.targets", "run.plots", "run.trackers",
               "trace.path", "data.root")  # (a trace file or dataset moved: the resume checks that its bytes are the run's)


def check_resume_overrides(overrides: list[str]) -> None:
    """FedsimError naming the first --set key that a resumed run may not change."""
    for text in overrides:
        section, key, _ = parse_override(text)
        close = did_you_mean(f"{section}.{key}", RESUME_KEYS)
        if section == "run" and key not in {f.name for f in dataclasses.fields(RunConfig)} and close:  # a typo
            raise FedsimError(f"--set {text!r}: unknown key {section}.{key}; {close}")
        if f"{section}.{key}" not in RESUME_KEYS:
            raise FedsimError(
                f"--set {text!r}: {section}.{key} cannot be changed when resuming (the run goes on "
                f"with the config it started with); with --resume only {', '.join(RESUME_KEYS)} "
                "can be set, so start a new run for other changes"
            )


_SECTION_CLASSES = {
    "run": RunConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "trace": TraceConfig,
    "server": ServerConfig,
    "client": ClientConfig,
    "algorithm": AlgorithmConfig,
    "devices": DevicesConfig,
}


def suggest(key: str, valid) -> str:
    """The end of an error line about an unknown `key`: the closest valid name, or all of them."""
    return did_you_mean(key, valid) or "valid keys: " + ", ".join(sorted(valid))


def algorithm_options(name: str, origin: str = "", key: str = "[algorithm] name") -> dict[str, Any]:
    """The algorithm's own config keys with their typed defaults (FedsimError if unknown; `key`:
    the config key that names it, for the error)."""
    if name in BUILT_IN_ALGORITHMS:  # known without importing it (and torch)
        return dict(ALGORITHM_OPTIONS.get(name, {}))
    where = f"{origin}: {key}" if origin else key
    return dict(ALGORITHMS.lookup(name, where).options)


def trace_options(source: str) -> dict[str, Any]:
    """The trace generator's own config keys with their typed defaults (none for a trace file;
    FedsimError if unknown)."""
    return _declared_options("trace", {"source": source}, [], "[trace] source")


def selection_options(policy: str, where: str = "[algorithm] selection") -> dict[str, Any]:
    """The selection policy's own [algorithm] keys with their typed defaults (none for most); a
    plugin's 'module:Class' is imported for them (FedsimError naming `where` if it cannot be)."""
    if not policy or policy in BUILT_IN_SELECTIONS:
        return dict(SELECTION_OPTIONS.get(policy, {}))
    return dict(SELECTIONS.lookup(policy, where).options)


def _check_type(where: str, value: Any, default: Any) -> Any:
    """Coerce ints to floats where a float is expected; refuse every other mismatch."""
    expected = type(default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    names = {float: "a number", int: "an integer", str: "a string", bool: "true or false",
             list: "a list", dict: "a table"}
    raise FedsimError(
        f"{where}: expected {names.get(expected, expected.__name__)}, got {value!r} "
        f"({type(value).__name__})"
    )


def _check_value(where: str, value: Any, rule: Rule) -> Any:
    """The value of a key once its rule (see `Rule`) holds; FedsimError naming the key if not."""
    if rule.text and isinstance(value, str):  # the numeric rules are for its numbers
        return rule.check(where, value) if rule.check else value
    if isinstance(value, float) and not math.isfinite(value):
        raise FedsimError(f"{where} = {value!r} must be a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise FedsimError(f"{where} = {value!r} is too large (it must fit in a signed 64-bit integer: at most "
                          f"{2**63 - 1})")
    if rule.choices is not None and value not in rule.choice_names() and not (rule.zero and value == ""):
        raise choice_error(where, value, rule.choice_names(), "is not valid")
    if rule.positive and not value > 0:
        raise FedsimError(f"{where} = {value!r} must be {'>= 1' if isinstance(value, int) else '> 0'}")
    if rule.non_negative and not value >= 0:
        raise FedsimError(f"{where} = {value!r} must be >= 0{f' (0 = {rule.zero})' if rule.zero else ''}")
    if rule.within:
        low, high, low_in, high_in = rule.within
        if not ((value >= low if low_in else value > low) and (value <= high if high_in else value < high)):
            raise FedsimError(f"{where} = {value!r} must be in {_interval(rule.within)}")
    if rule.word and value != rule.word[0] and not (isinstance(value, int) and value >= 1):
        raise FedsimError(f"{where} = {value!r} must be \"{rule.word[0]}\" ({rule.word[1]}) or a number "
                          f"of {where.rsplit(' ', 1)[-1]} >= 1")
    return rule.check(where, value) if rule.check else value


def _declared_options(section: str, raw: dict, algorithms: list, origin: str,
                      algorithms_origin: str = "", selection_origin: str = "") -> dict[str, Any] | None:
    """Option keys (with typed defaults) that the chosen generator / algorithm(s) declare.

    None for sections without options. [algorithm] accepts the options of its own `name` and of
    every name in run.algorithms, so one file can configure a side-by-side comparison.
    """
    if section == "trace":
        source = raw.get("source", TraceConfig.source)
        if source == "file":
            return {}
        if source not in GENERATORS.names() and ":" not in str(source):
            raise choice_error(f"{origin}: [trace] source", source, ["file", *GENERATORS.names()])
        return dict(GENERATORS.lookup(source, f"{origin}: [trace] source").options)
    if section == "algorithm":
        options: dict[str, Any] = {}
        named = [(raw.get("name", AlgorithmConfig.name), origin, "[algorithm] name"),
                 *((name, algorithms_origin or origin, "[run] algorithms") for name in algorithms)]
        for name, where, key in named:
            if not isinstance(name, str):
                raise FedsimError(f"{where}: algorithm names must be strings, got {name!r}")
            options.update(algorithm_options(name, origin=where, key=key))
        policy = raw.get("selection", "")
        if not isinstance(policy, str):
            raise FedsimError(f"{selection_origin or origin}: [algorithm] selection = {policy!r} must be a policy's "
                              "name (a string)")
        options.update(selection_options(policy, f"{selection_origin or origin}: [algorithm] selection"))
        return options
    if section == "model" and set(raw) - set(_field_names(ModelConfig)):  # (looked up only where keys ask for it)
        return model_options(raw.get("name", ModelConfig.name), origin)
    return None


def model_options(name: str, origin: str = "") -> dict[str, Any] | None:
    """A model plugin's own config keys with their typed defaults: its factory's `options`
    (None for a built-in model, which has none)."""
    if name in BUILT_IN_MODELS or not isinstance(name, str):
        return None
    factory = MODELS.lookup(name, f"{origin}: [model] name" if origin else "[model] name")
    declared = getattr(factory, "options", {})
    if not isinstance(declared, dict) or not all(isinstance(k, str) for k in declared):
        raise FedsimError(f"{origin}: [model] name = {name!r}: its `options` = {declared!r} must be a dict of key "
                          "names to default values, e.g. make.options = {'heads': 4}")
    return dict(declared)


def takes_one_value(section: str, key: str) -> bool:
    """Whether config key [section] key is one of the typed keys whose value is not a list."""
    cls = _SECTION_CLASSES.get(section)
    field = next((f for f in dataclasses.fields(cls) if f.name == key), None) if cls else None
    if field is None or field.name == "options":
        return False
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    return not isinstance(default, (list, tuple))


def _field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.name != "options"]


def _build_section(section: str, raw: dict, algorithms: list, origin: str, origins: dict):
    cls = _SECTION_CLASSES[section]
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "options"}
    owner = (section, "source" if section == "trace" else "name")  # the key that declares the options
    extra = _declared_options(section, raw, algorithms, origins.get(owner, origin),
                              origins.get(("run", "algorithms"), origin), origins.get(("algorithm", "selection"), origin))
    defaults = cls()
    kwargs, options = {}, {}
    for key, value in raw.items():
        where = f"{origins.get((section, key), origin)}: [{section}] {key}"
        if key in fields:
            ruled = rule(fields[key])
            if ruled.text and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = float(value)  # a number key that also takes a word
            elif not ((ruled.word and type(value) is int) or (ruled.text and isinstance(value, str))):
                value = _check_type(where, value, getattr(defaults, key))
            kwargs[key] = _check_value(where, value, ruled)
        elif extra is not None and key in extra:
            default = extra[key]
            options[key] = value if default is None else _check_type(where, value, default)
    if extra is not None:
        kwargs["options"] = options
    return cls(**kwargs)


NATURAL_DATASETS = ("femnist", "shakespeare", "sent140", "parquet")  # with their own clients
NO_ACCURACY_DATASETS = ("quadratic",)  # tasks without classes: a test loss, no test accuracy
# keys that only datasets with their own clients read, and those that only parquet reads
NATURAL_ONLY = ("users",)
PARQUET_ONLY = ("client_column", "label_column", "feature_column", "tokens")


def _check_federated_keys(data: DataConfig, origin: str) -> None:
    """A key set for a dataset that does not read it is a mistake, not a no-op."""
    given = [k for k in (*NATURAL_ONLY, *PARQUET_ONLY) if getattr(data, k) != getattr(DataConfig, k)]
    wrong = [k for k in given if (k in PARQUET_ONLY and data.dataset != "parquet")
             or (k in NATURAL_ONLY and data.dataset not in NATURAL_DATASETS)]
    if wrong:
        readers = "dataset = 'parquet'" if wrong[0] in PARQUET_ONLY else "a dataset with its own clients"
        raise FedsimError(f"{origin}: [data] {wrong[0]} does not apply to [data] dataset = {data.dataset!r} "
                          f"(only {readers} reads it); remove it")


def _unknown_keys(raw: dict, algorithms: list, origin: str, origins: dict) -> list[tuple[str, str, str]]:
    """(where it was set, `[section] key` or `section [name]`, the closest valid name or all
    of them) of every unknown key and section of `raw`."""
    unknown = []
    for section, body in raw.items():
        if section not in _SECTION_CLASSES:
            first = next(iter(body), None) if isinstance(body, dict) else None
            owners = [name for name, cls in _SECTION_CLASSES.items() if section in _field_names(cls)]
            if not isinstance(body, dict) and owners:  # `rounds = 5` above every [section]
                unknown.append((origin, f"key {section} outside any section",
                                f"it is a [{owners[0]}] key: write it under [{owners[0]}]"))
                continue
            unknown.append((origins.get((section, first), origin), f"section [{section}]",
                            suggest(section, _SECTION_CLASSES)))
            continue
        owner_key = (section, "source" if section == "trace" else "name")  # declares the options
        extra = _declared_options(section, body, algorithms, origins.get(owner_key, origin),
                                  origins.get(("run", "algorithms"), origin),
                                  origins.get(("algorithm", "selection"), origin))
        valid = [*_field_names(_SECTION_CLASSES[section]), *(extra or {})]
        owner = body.get(owner_key[1])
        scope = f" for {owner!r}" if extra is not None and owner else ""
        declare = "; a model plugin takes keys of its own that its factory declares (`options`, docs/extending.md)" \
            if section == "model" and extra == {} else ""
        unknown += [(origins.get((section, key), origin), f"[{section}] {key}{scope}",
                     (section == "algorithm" and _policy_of(key)) or suggest(key, valid) + declare)
                    for key in body if key not in valid]
    return unknown


def _policy_of(key: str) -> str:
    """For a key of a selection policy that the config does not choose: which one takes it."""
    policy = next((p for p, keys in SELECTION_OPTIONS.items() if key in keys), "")
    return f"it is a key of [algorithm] selection = '{policy}': set that selection, or remove it" if policy else ""


def _unknown_error(unknown: list[tuple[str, str, str]]) -> FedsimError:
    """One line for every unknown key: `FILE: unknown key [s] k; did you mean 'x'?`, and for
    several, each with its own suggestion (and file, where they differ)."""
    if len(unknown) == 1:
        ((where, what, hint),) = unknown
        return FedsimError(f"{where}: unknown {what if what.startswith(('section', 'key ')) else 'key ' + what}; {hint}")
    first = unknown[0][0]
    parts = [("" if where == first else f"{where}: ") + f"{what} ({hint})" for where, what, hint in unknown]
    sections = any(what.startswith("section") for _, what, _ in unknown)
    return FedsimError(f"{first}: {len(unknown)} unknown keys{' and sections' * sections}: " + "; ".join(parts))


def config_from_dict(raw: dict, origin: str = "<config>", origins: dict | None = None,
                     where: str | None = None) -> Config:
    """Validate a nested dict (as parsed from TOML) into a Config; `origins` names where each
    (section, key) was set, for error lines and `config show` (config_layers.py); `where`
    names the whole config in the errors of rules across keys (default: `origin`), which a
    study's point breaks as a combination of its values."""
    origins = origins or {}
    for section, body in raw.items():
        if section in _SECTION_CLASSES and not isinstance(body, dict):
            raise FedsimError(f"{origin}: '{section}' must be a [{section}] table, got {body!r}")
    algorithms = raw.get("run", {}).get("algorithms", [])
    if not isinstance(algorithms, list) or not all(isinstance(a, str) for a in algorithms):
        raise FedsimError(f"{origins.get(('run', 'algorithms'), origin)}: [run] algorithms must be a list of names "
                          f"(strings), got {algorithms!r}")
    unknown = _unknown_keys(raw, algorithms, origin, origins)
    if unknown:
        raise _unknown_error(unknown)
    raw = _with_model_defaults(raw)
    built = {
        section: _build_section(section, raw.get(section, {}), algorithms, origin, origins)
        for section in _SECTION_CLASSES
    }
    config = Config(**built, source=origin, origins=dict(origins))
    try:
        _check_consistency(config, where or origin)
    except FedsimError as err:  # (a study's point is named as the combination of its values)
        raise (err if where else _blamed(err, config, origin)) from None
    return config


def _blamed(err: FedsimError, config: Config, where: str) -> FedsimError:
    """A rule across keys broken by a `--set`: its line names that `--set` (the user's last
    word, as a single key's error does), not the config file: the first key of the line that
    a `--set` gave."""
    text = str(err)
    label = first_origin(text, config.origins, only_set=True) if text.startswith(f"{where}: ") else None
    return FedsimError(label + text[len(where):]) if label else err


def blamed(text: str, config: Config) -> str:
    """`text` (a line about `[section] key`s) led by where the first key it names was set (a
    `--set`, or the file), as a config's own errors are; as it is where none was given."""
    label = first_origin(text, config.origins)
    return f"{label}: {text}" if label else text


def first_origin(text: str, origins: dict, only_set: bool = False) -> str | None:
    """Where the first `[section] key` that `text` names was set, by a config's `origins`
    (only a `--set`: `only_set`)."""
    found = [(hit.start(), label) for (section, key), label in origins.items()
             if not only_set or label.startswith("--set ")
             for hit in [re.search(rf"\[{section}\] {re.escape(key)}\b", text)] if hit]
    return min(found)[1] if found else None


# [model] keys whose default is that of the paper's architecture of the name: FedAWE's
# Table 6 puts dropout 0.2 before every dense layer of its CINIC-10 CNN
MODEL_DEFAULTS = {"cnn-cinic": {"dropout": 0.2}}


def _with_model_defaults(raw: dict) -> dict:
    model = raw.get("model", {})
    name = model.get("name")
    defaults = MODEL_DEFAULTS.get(name, {}) if isinstance(name, str) else {}
    return {**raw, "model": {**defaults, **model}} if defaults else raw


def _check_consistency(config: Config, origin: str) -> None:
    """Cross-key rules that no single field can check."""
    if config.trace.source == "file" and not config.trace.path:
        raise FedsimError(f"{origin}: [trace] source = 'file' needs [trace] path = 'trace.parquet'")
    named = config.origins.get(("algorithm", "name"), "")
    if config.run.algorithms and named.startswith("--set ") and config.algorithm.name not in config.run.algorithms:
        name, listed = config.algorithm.name, ", ".join(f'"{a}"' for a in config.run.algorithms)
        raise FedsimError(f"{named}: this config runs [run] algorithms = [{listed}], which take the place of "
                          f"[algorithm] name; to run {name} alone add --set 'run.algorithms=[]', or compare it: "
                          f"--set 'run.algorithms=[{listed}, \"{name}\"]'")
    given = config.origins.get(("trace", "path"), "")
    if config.trace.source != "file" and given.startswith("--set "):  # (a base's or a study's path may rest)
        raise FedsimError(f"{given}: [trace] path is read only with source = 'file', and the trace here is "
                          f"{config.trace.source!r}; add --set trace.source=file")
    if config.data.dataset == "quadratic" and config.model.name != ModelConfig.name:
        raise FedsimError(f"{origin}: [model] name = {config.model.name!r} does not apply to the quadratic task "
                          "(its model is the vector x: set its start with [model] init); remove it")
    if config.data.dataset == "quadratic" and config.data.partition != DataConfig.partition:
        raise FedsimError(f"{origin}: [data] partition = {config.data.partition!r} does not apply to the "
                          "quadratic task (its clients are their targets); remove it")
    _check_federated_keys(config.data, origin)
    if config.data.dataset != "quadratic":  # (whose model is its vector)
        MODELS.check_name(config.model.name, f"{origin}: [model] name")
    if config.server.mode == "async" and config.server.timing == "ideal":
        raise FedsimError(f"{origin}: [server] mode = 'async' needs timing = 'model' (ideal timing "
                          "is the papers' synchronous round model)")
    _check_round_rules(config, origin)
    if config.server.mode == "async":
        # they need synchronous rounds: sequential-sgd trains on the pooled data, not through
        # device tasks; fedavg-wait and MIFA's warm-up hold the model fixed while they wait for
        # given devices, which buffered aggregation does not do (its buffer may never fill)
        for name in [config.algorithm.name, *config.run.algorithms]:
            warmup = name == "mifa" and config.algorithm.options.get("warmup", False)
            if name in ("sequential-sgd", "fedavg-wait") or warmup:
                what = f"'{name}' with warmup = true" if warmup else f"'{name}'"
                raise FedsimError(
                    f"{origin}: [algorithm] {what} cannot run with [server] mode = 'async' (it "
                    "needs synchronous rounds); set [server] mode = 'sync'"
                    + (" or warmup = false" if warmup else " or choose another algorithm")
                )
    _check_power_of_choice(config, origin)
    _check_devices(config.devices, origin)
    for name in [config.algorithm.name, *config.run.algorithms]:
        for key, bounds in ALGORITHM_RANGES.get(name, {}).items():
            check_option(name, key, config.algorithm.options.get(key, ALGORITHM_OPTIONS[name][key]), *bounds,
                         where=f"{origin}: ")
        for key, words in ALGORITHM_CHOICES.get(name, {}).items():
            if config.algorithm.options.get(key, ALGORITHM_OPTIONS[name][key]) not in words:
                raise choice_error(f"{origin}: [algorithm] {key}", config.algorithm.options[key], words,
                                   f"for {name!r} is not valid")
    _check_fedasync(config, origin)
    policy = config.algorithm.selection
    for key, bounds in SELECTION_RANGES.get(policy, {}).items():
        check_option(policy, key, config.algorithm.options.get(key, SELECTION_OPTIONS[policy][key]), *bounds,
                     where=f"{origin}: ")
    _check_local_work(config, origin)
    _check_partial_work(config, origin)
    steps = math.ceil(config.client.local_epochs) if config.client.local_epochs else config.client.local_steps
    check_run_steps(config, steps, "local_epochs" if config.client.local_epochs else "local_steps", origin)
    if config.data.dataset == "quadratic" and config.data.targets:
        if len(config.data.targets) != config.data.clients:
            raise FedsimError(
                f"{origin}: [data] targets has {len(config.data.targets)} entries but "
                f"[data] clients = {config.data.clients}; give one target per client"
            )


# FedAsync's staleness keys, by the staleness function that reads them
FEDASYNC_KEYS = {"poly_a": "polynomial", "hinge_a": "hinge", "hinge_b": "hinge"}


def _check_fedasync(config: Config, origin: str) -> None:
    """FedAsync mixes every arrival into the model on its own: one arrival per aggregation, so
    that the server's version count is its t (the staleness t - tau counts every update). A
    staleness key that the chosen function does not read is a mistake, not a no-op."""
    if "fedasync" not in [config.algorithm.name, *config.run.algorithms]:
        return
    server = config.server
    named = "[run] algorithms (with 'fedasync')" if "fedasync" in config.run.algorithms else \
        "[algorithm] name = 'fedasync'"
    if server.mode != "async":
        raise FedsimError(f"{origin}: {named} mixes each update into the model as it arrives "
                          "(Xie et al.), which needs [server] mode = 'async' and buffer = 1; set both, or "
                          "choose another algorithm for synchronous rounds")
    if server.buffer != 1:
        raise FedsimError(f"{origin}: {named} applies every arrival on its own, so [server] buffer "
                          f"= {server.buffer} must be 1 (each arrival one aggregation, its staleness counted in "
                          "them); set [server] buffer = 1" + (
                              "; to compare it with algorithms of a larger buffer, sweep them in a study with "
                              'zip = [["algorithm.name", "server.buffer"]] (docs/studies.md)'
                              if len(config.run.algorithms) > 1 else ""))
    staleness = config.algorithm.options.get("staleness", ALGORITHM_OPTIONS["fedasync"]["staleness"])
    for key, reader in FEDASYNC_KEYS.items():
        if key in config.algorithm.options and staleness != reader:
            raise FedsimError(f"{origin}: [algorithm] {key} applies to staleness = '{reader}' only (fedasync's "
                              f"staleness is '{staleness}'); remove it or set staleness = '{reader}'")


def _check_local_work(config: Config, origin: str) -> None:
    """What a device's task is made of must exist: epochs need samples and minibatches, a
    cohort needs its devices (datasets with their own clients may have fewer than [data] clients,
    which the run checks again once it has read them)."""
    client, dataset = config.client, config.data.dataset
    where = f"{origin}: [client] local_epochs = {client.local_epochs:g}"
    if client.local_epochs and dataset == "quadratic":
        raise FedsimError(f"{where}: the quadratic task has no samples to pass over; set local_steps instead")
    if client.local_epochs and client.batch_size == 0:
        raise FedsimError(f"{where} needs batch_size > 0 to cut each epoch into minibatches (with batch_size = 0 "
                          f"a step is already one pass over the local data: set local_steps instead)")
    check_cohort_size(config.server, config.data.clients, f"{origin}: ")


def _check_partial_work(config: Config, origin: str) -> None:
    """fit-deadline fits a device's steps to its speed: ideal timing has no speeds (every invited
    device trains its whole task within the round)."""
    if config.client.work == "fit-deadline" and config.server.timing == "ideal":
        raise FedsimError(f"{origin}: [client] work = 'fit-deadline' needs device speeds, which timing = 'ideal' "
                          "does not have (every device finishes its task within the round); set [server] "
                          "timing = 'model' or work = 'full'")


def check_cohort_size(server: ServerConfig, n_devices: int, where: str = "") -> None:
    if server.clients_per_round > n_devices:
        raise FedsimError(
            f"{where}[server] clients_per_round = {server.clients_per_round} is more than the {n_devices} "
            f"devices of the run ([data] clients); give at most {n_devices}, or 0 for every online device")


def check_option(algorithm: str, key: str, value: Any, low: float, high: float = math.inf, low_open: bool = False,
                 why: str = "", where: str = "") -> None:
    """FedsimError unless ``low <(=) value <= high``: one line naming the algorithm's key and the fix."""
    if not ((value > low if low_open else value >= low) and value <= high):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        if high != math.inf:
            bound = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        raise FedsimError(f"{where}[algorithm] {key} = {value!r} for {algorithm!r} must be {bound}"
                          + (f" ({why})" if why else ""))


def check_run_steps(config: Config, task_steps: int, steps_key: str, origin: str) -> None:
    """FedsimError when rounds x devices a round x `task_steps` (the largest task's local
    steps, set by `[client] steps_key`) is more than MAX_RUN_STEPS."""
    server, rounds = config.server, config.run.rounds
    if server.mode == "async":
        devices, per_round = server.buffer, f"[server] buffer = {server.buffer:,} arrivals an aggregation"
    elif server.clients_per_round:
        devices, per_round = server.clients_per_round, f"[server] clients_per_round = {server.clients_per_round:,}"
    else:
        devices, per_round = config.data.clients, f"[data] clients = {config.data.clients:,} (every online device)"
    total = rounds * devices * task_steps
    if total > MAX_RUN_STEPS:
        key = "[server] buffer" if server.mode == "async" else per_round.split(" =")[0]
        raise FedsimError(
            f"{origin}: the run asks for up to {total:,} local steps ([run] rounds = {rounds:,} x {per_round} x "
            f"{task_steps:,} steps a task by [client] {steps_key}), more than any run finishes (at most "
            f"{MAX_RUN_STEPS:,}); lower [run] rounds, {key} or [client] {steps_key}")


ROUND_RULES = ("deadline_sigma", "min_selected", "update_frac")  # FLASH's, for synchronous model timing


def _check_round_rules(config: Config, origin: str) -> None:
    """FLASH's round rules need rounds with a deadline and devices that can miss it."""
    server = config.server
    for name in ROUND_RULES:
        if getattr(server, name) == getattr(ServerConfig, name):
            continue
        if server.timing == "ideal":
            raise FedsimError(f"{origin}: [server] {name} means nothing under timing = 'ideal' (every "
                              "invited device arrives at the round's end); remove it or set timing = 'model'")
        if server.mode == "async":
            raise FedsimError(f"{origin}: [server] {name} is a rule of synchronous rounds, not of "
                              "mode = 'async'; remove it or set mode = 'sync'")
    if server.min_selected > config.data.clients:
        raise FedsimError(f"{origin}: [server] min_selected = {server.min_selected} is more than the "
                          f"{config.data.clients} devices ([data] clients): no round could ever start; "
                          "lower it")


def _check_power_of_choice(config: Config, origin: str) -> None:
    """Power-of-choice chooses K of d candidates, in synchronous rounds, for algorithms that
    invite through the selection policy; its key `candidates` is checked against the round's
    budget here (its range, and its absence under other policies, like every policy's keys)."""
    algorithm, server = config.algorithm, config.server
    where = f"{origin}: [algorithm] selection = 'power-of-choice'"
    if algorithm.selection != "power-of-choice":
        return
    if not server.clients_per_round:
        raise FedsimError(f"{where} invites the clients_per_round candidates with the highest loss, but [server] "
                          "clients_per_round = 0 invites every online device; set clients_per_round > 0")
    if server.mode == "async":
        raise FedsimError(f"{where} is a rule of synchronous rounds, not of [server] mode = 'async'; "
                          "set mode = 'sync' or another selection")
    for name in [algorithm.name, *config.run.algorithms]:
        if name in ("fedavg-wait", "sequential-sgd"):
            raise FedsimError(f"{where} does not apply to [algorithm] {name!r} (it does not invite through the "
                              "selection policy); remove the selection or choose another algorithm")
    invited, d = invite_budget(server), algorithm.options.get("candidates", 0)
    if d and not invited <= d <= config.data.clients:
        per_round = (f"the {invited} devices invited per round" if invited == server.clients_per_round else
                     f"the {invited} devices invited per round (clients_per_round with overcommit)")
        raise FedsimError(f"{origin}: [algorithm] candidates = {d} must be at least {per_round} "
                          f"and at most [data] clients = {config.data.clients}; give a value in that range, "
                          "or 0 for twice the devices invited")


def invite_budget(server: ServerConfig) -> int:
    """How many devices a synchronous round invites: K, or ceil(K (1 + overcommit)) under
    model timing (0 = every online device). Ideal timing has no stragglers to overcommit against."""
    k = server.clients_per_round
    if not k or server.timing == "ideal":
        return k
    return math.ceil(k * (1 + server.overcommit) - 1e-9)  # 10 * 1.1 is 11.000000000000002


def _check_devices(devices: DevicesConfig, origin: str) -> None:
    """A [devices] key away from its default must be one that the chosen model reads."""
    defaults = DevicesConfig()
    for name, models in DEVICE_MODEL_KEYS.items():
        if getattr(devices, name) != getattr(defaults, name) and devices.model not in models:
            keep = (f"; to keep the numbers of a config written before 'profiles' became the default, "
                    f"set [devices] model = \"lognormal\"" if devices.model == "profiles" else "")
            named = [repr(m) for m in models]
            either = f"{', '.join(named[:-1])} or {named[-1]}" if len(named) > 1 else named[0]
            raise FedsimError(f"{origin}: [devices] {name} applies to model = {either}, not {devices.model!r}; remove it "
                              f"or set [devices] model{keep} (docs/timing.md)")
    from fedsim.sim.profiles import NAMES

    classes = devices.classes or list(NAMES)
    if devices.class_weights and len(devices.class_weights) != len(classes):
        raise FedsimError(f"{origin}: [devices] class_weights has {len(devices.class_weights)} shares for "
                          f"{len(classes)} classes ({', '.join(classes)}); give one share per class")


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value); value is a TOML literal or a bare string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise FedsimError(f"--set {text!r}: expected section.key=value, e.g. --set run.rounds=50")
    path, literal = text.split("=", 1)
    section, key = path.strip().split(".", 1)
    try:
        value = toml_value(literal)
    except tomllib.TOMLDecodeError:
        if literal.strip().startswith("["):  # a list of bare words: say how to quote them
            items = [item.strip().strip("'\"") for item in literal.strip().strip("[]").split(",") if item.strip()]
            quoted = ", ".join(item if _is_number(item) else f'"{item}"' for item in items)
            raise FedsimError(f"--set {text!r}: {literal.strip()} is not a TOML list; quote its words, as in "
                              f"--set '{path.strip()}=[{quoted}]'") from None
        value = literal
    return section, key.strip(), value


def toml_value(literal: str) -> Any:
    """A TOML literal's value (0.3, [1, 0.5], "sine", true), a date-time as its text (fedsim's
    keys take times as ISO 8601 text: `--set trace.offset=2024-03-01T08:00:00`, unquoted); a
    TOMLDecodeError where the text is no literal."""
    return _times_as_text(tomllib.loads(f"v = {literal}")["v"])


def _times_as_text(value: Any) -> Any:
    """TOML's date-times (and dates, times) as ISO 8601 text, in tables and lists too."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _times_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_times_as_text(v) for v in value]
    return value


def _is_number(word: str) -> bool:
    try:
        tomllib.loads(f"v = {word}")
    except tomllib.TOMLDecodeError:
        return False
    return True


FILE_KEYS = (("trace", "path"), ("trace", "devices_table"), ("model", "init_from"),
             ("data", "root"))  # the files (and the dataset folder) a config names


def absolute_out(raw: dict) -> None:
    """`raw`'s `[run] out` as an absolute path: what a run's config.toml records, so that a
    resume from another directory finds what lives beside the runs (MLflow's default store)."""
    run = raw.get("run")
    if isinstance(run, dict) and isinstance(run.get("out"), str):
        run["out"] = str(Path(run["out"]).absolute())


def absolute_file_keys(raw: dict, source: str | Path) -> None:
    """`raw`'s (a config's sections) trace file, device table, warm start and dataset folder as absolute paths,
    found as a run finds them (in the working directory, then beside the file `source`), so
    that a config.toml or study.toml written with them names them from any directory; a path
    found nowhere stays as given (the run's own checks name it)."""
    for section, key in FILE_KEYS:
        value = raw.get(section, {}).get(key) if isinstance(raw.get(section), dict) else None
        if isinstance(value, str) and value and not Path(value).is_absolute():
            found = next((p for p in (Path(value), Path(source).parent / value) if p.exists()), None)
            if found is not None:
                raw[section][key] = str(found.absolute())


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        hint = did_you_mean(path, scenario_names()) if not path.suffix else ""  # a scenario's name, mistyped
        raise FedsimError(f"config {path}: " + (f"no such file or scenario; {hint}" if hint else
                                                 "no such file; pass an existing .toml file or a scenario name"))
    try:
        return _times_as_text(tomllib.loads(path.read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError as err:
        raise FedsimError(f"config {path}: invalid TOML ({err})") from None
    except UnicodeDecodeError:
        if Path(path).read_bytes()[:4] == b"PAR1":
            raise FedsimError(f"config {path}: is a Parquet file (a trace, or a dataset's table), not a TOML config; "
                              "a trace goes in a config as [trace] path (--set trace.path=FILE --set trace.source=file)") \
                from None
        raise FedsimError(f"config {path}: not UTF-8 text; save the TOML file as UTF-8") from None
    except OSError as err:
        raise FedsimError(f"config {path}: cannot read it ({err.strerror}); "
                          "pass a readable .toml file or a scenario name") from None


def scenario_names() -> list[str]:
    files = resources.files("fedsim.scenarios").iterdir()
    return sorted(p.name[:-5] for p in files if p.name.endswith(".toml"))


def scenario_path(name: str) -> Path:
    return Path(str(resources.files("fedsim.scenarios").joinpath(f"{name}.toml")))


def is_study(raw: dict) -> bool:
    """A parsed TOML file is a study (for `fedsim sweep`) when it has a [sweep] table, or is the
    study.toml that a sweep records in a study's folder (its base config and axes)."""
    return "sweep" in raw or isinstance(raw.get("base"), dict) and "axes" in raw


def config_scenarios() -> list[str]:
    """The built-in scenarios that are single configs (for `fedsim run`), not studies."""
    return [name for name in scenario_names() if not is_study(read_toml(scenario_path(name)))]


def dump_toml(sections: dict[str, dict[str, Any]]) -> str:
    """TOML text of a two-level dict (the resolved config written to the run directory), by
    tomli-w, which escapes what a hand-written writer missed (a newline in a run name)."""
    import tomli_w

    return tomli_w.dumps(sections)
