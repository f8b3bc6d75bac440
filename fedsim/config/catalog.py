"""Every named choice of fedsim, in one place: its registry (fedsim/config/registry.py).

The built-ins are listed here by import path, so that the config checks, ``--help`` and error
listings know every valid name without importing torch or the modules that implement them.
Algorithms, models, generators and converters are open to plugins (``"module:Name"`` or an
entry point of the group named below; docs/extending.md); the other choices are closed lists.
"""

from __future__ import annotations

import math

from fedsim.config.registry import Registry


def _paths(module: str, names: dict[str, str]) -> dict[str, str]:
    return {name: f"{module}:{attr}" for name, attr in names.items()}


ALGORITHMS = Registry("a subclass of fedsim.algorithms.Strategy", "fedsim.algorithms.base:is_strategy", {
    **_paths("fedsim.algorithms.fedavg", {"fedavg": "FedAvg", "fedavg-all": "FedAvgAll",
                                          "fedavg-known-p": "FedAvgKnownP", "fedbuff": "FedBuff",
                                          "fedsgd": "FedSGD", "fedprox": "FedProx"}),
    "fedavg-wait": "fedsim.algorithms.waiting:FedAvgWait",
    **_paths("fedsim.algorithms.mifa", {"mifa": "Mifa", "fedlaavg": "FedLaAvg"}),
    "fedvarp": "fedsim.algorithms.fedvarp:FedVarp",
    "fedawe": "fedsim.algorithms.fedawe:FedAwe",
    "amplified": "fedsim.algorithms.amplified:Amplified",
    "fedau": "fedsim.algorithms.fedau:FedAu",
    "sequential-sgd": "fedsim.algorithms.sequential:SequentialSgd",
    "scaffold": "fedsim.algorithms.scaffold:Scaffold",
    "feddyn": "fedsim.algorithms.feddyn:FedDyn",
}, group="fedsim.algorithms")

# the own config keys of the built-in algorithms with their typed defaults (each class's
# `options` is its entry): declared here, so that a config is checked without importing the
# algorithms and torch; a plugin declares its own on its class
ALGORITHM_OPTIONS = {"fedprox": {"mu": 0.01}, "fedavg-wait": {"S": 0}, "mifa": {"warmup": False},
                     "fedlaavg": {"beta": 0.0}, "fedawe": {"clip": 0.0}, "amplified": {"period": 500, "eta": 10.0},
                     "fedau": {"cutoff": 50}}
ALGORITHM_OPTIONS["feddyn"] = {"alpha": 0.01}
# the ranges of those keys: (lowest, highest, whether the lowest is excluded, what the key
# means), checked with the config and again when the algorithm is set up (each class's `ranges`)
ALGORITHM_RANGES = {
    "fedprox": {"mu": (0.0, math.inf, False, "proximal coefficient; 1.0 on MNIST, 0.01 on text in FedLaAvg")},
    "fedlaavg": {"beta": (0.0, 1.0, False, "fraction of all devices selected per round; 0 = use [server] "
                                           "clients_per_round")},
    "fedawe": {"clip": (0.0, math.inf, False, "max L2 norm of the aggregated echoed update; 0 = off")},
    "amplified": {"period": (1, math.inf, False, "rounds between amplifications (P)"),
                  "eta": (0.0, math.inf, True, "amplification factor; 1 = FedAvg")},
    "fedau": {"cutoff": (1, math.inf, False, "K, the longest interval recorded, in rounds")},
}
ALGORITHM_RANGES["feddyn"] = {"alpha": (0.0, math.inf, True, "weight of the dynamic regulariser; the paper "
                                                            "tries 0.1, 0.01 and 0.001")}
BUILT_IN_ALGORITHMS = tuple(ALGORITHMS)

# a model is a function (in_shape, n_classes, [model] config) -> a torch.nn.Module
MODELS = Registry("a function (in_shape, n_classes, model_config) -> torch.nn.Module", callable,
                  _paths("fedsim.training.architectures", {
                      "logreg": "logreg", "mlp": "mlp", "lenet5": "lenet5", "cnn-svhn": "cnn_svhn",
                      "cnn-cifar": "cnn_cifar", "cnn-cinic": "cnn_cinic", "cnn-fmnist": "cnn_fmnist",
                      "cnn-cifar-wj": "cnn_cifar_wj", "cnn-femnist": "cnn_femnist", "lstm": "lstm",
                      "char-lstm": "char_lstm"}) | {"resnet18-gn": "fedsim.training.resnet:resnet18_gn"},
                  group="fedsim.models")

GENERATORS = Registry("a fedsim.traces.generators.GeneratorSpec", "fedsim.traces.generators:is_generator",
                      {name: f"fedsim.traces.generators:BUILT_IN.{name}" for name in (
                          "always", "bernoulli", "grid", "periodic", "markov", "sleep-window",
                          "diurnal")},
                      group="fedsim.generators")

# a converter is a function (path, where, horizon, *, options...) -> Trace (docs/extending.md)
CONVERTERS = Registry("a function (path, where, horizon) -> fedsim.traces.Trace", callable,
                      _paths("fedsim.traces.converters", {
                          "fedscale": "fedscale", "flash": "flash", "sessions": "sessions",
                          "csv": "csv"}),
                      group="fedsim.converters")

PARTITIONS = Registry("a partition", callable, _paths("fedsim.data.partition", {
    "iid": "iid", "dirichlet": "dirichlet", "classes": "classes", "one-class": "one_class",
    "majority": "majority", "natural": "natural"}))

SCHEDULES = Registry("a learning-rate schedule", callable, _paths("fedsim.training.schedules", {
    "constant": "constant", "inverse": "inverse", "inverse-sqrt": "inverse_sqrt", "step": "step"}))

TRAINERS = Registry("a trainer", callable, {
    "auto": "fedsim.training.auto:AutoTrainer", "batched": "fedsim.training.cohort:BatchedTrainer",
    "loop": "fedsim.training.loop:LoopTrainer"})

SELECTIONS = Registry("a selection policy", callable, _paths("fedsim.algorithms.selection", {
    "all": "SelectAll", "uniform": "SelectUniform", "regularized": "SelectRegularized",
    "longest-absent": "SelectLongestAbsent"}))

# which trace devices a run replays when the trace has more than [data] clients
TRACE_SELECTIONS = Registry("a trace device selection", callable, _paths("fedsim.runs.replay", {
    "random": "select_random", "first": "select_first", "most-available": "select_most_available"}))

__all__ = ["ALGORITHMS", "ALGORITHM_OPTIONS", "ALGORITHM_RANGES", "BUILT_IN_ALGORITHMS", "MODELS", "GENERATORS", "CONVERTERS", "PARTITIONS", "SCHEDULES",
           "TRAINERS", "SELECTIONS", "TRACE_SELECTIONS"]
