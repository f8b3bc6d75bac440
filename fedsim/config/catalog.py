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
    "fedasync": "fedsim.algorithms.fedasync:FedAsync",
    "fednova": "fedsim.algorithms.fednova:FedNova",
    "scaffold": "fedsim.algorithms.scaffold:Scaffold",
    "feddyn": "fedsim.algorithms.feddyn:FedDyn",
}, group="fedsim.algorithms", known_as={
    **{f"fed{opt}": f"'fedavg' with [algorithm] server_optimizer = '{opt}'" for opt in ("adam", "adagrad", "yogi")},
    "fedavgm": "'fedavg' with [algorithm] server_optimizer = 'momentum' (and server_momentum, default 0.9)",
    "oort": "a selection policy: [algorithm] selection = 'oort' (with 'fedavg' or another algorithm)",
    "power-of-choice": "a selection policy: [algorithm] selection = 'power-of-choice'",
})

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
# FedAsync (Xie et al. 2019): the mixing weight (the paper's alpha; `alpha` is FedDyn's) and its staleness function s, with the paper's
# experiments' values (FedAsync+Poly a = 0.5; FedAsync+Hinge a = 10, b = 4)
ALGORITHM_OPTIONS["fedasync"] = {"mixing": 0.6, "staleness": "polynomial", "poly_a": 0.5, "hinge_a": 10.0,
                                 "hinge_b": 4.0, "rho": 0.0}
ALGORITHM_RANGES["fedasync"] = {
    "mixing": (0.0, 1.0, True, "the paper's alpha, the weight of a fresh update: x <- (1 - mixing s) x + mixing s x_i"),
    "poly_a": (0.0, math.inf, False, "polynomial staleness: s = (1 + staleness)^(-poly_a)"),
    "hinge_a": (0.0, math.inf, False, "hinge staleness: s = 1 / (hinge_a (staleness - hinge_b) + 1) past hinge_b"),
    "hinge_b": (0.0, math.inf, False, "hinge staleness: the staleness up to which s = 1"),
    "rho": (0.0, math.inf, False, "the devices' proximal term (rho/2)||w - x_start||^2; 0 = plain local SGD"),
}
# an algorithm's word-valued keys and their valid words, checked with the config
ALGORITHM_CHOICES = {"fedasync": {"staleness": ("constant", "polynomial", "hinge")}}
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
BUILT_IN_MODELS = tuple(MODELS)

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

SELECTIONS = Registry("a subclass of fedsim.algorithms.selection.Selector", "fedsim.algorithms.selection:is_selector",
                      _paths("fedsim.algorithms.selection", {
                          "all": "SelectAll", "uniform": "SelectUniform", "regularized": "SelectRegularized",
                          "longest-absent": "SelectLongestAbsent",
                          "power-of-choice": "SelectPowerOfChoice"}) | {
                          "oort": "fedsim.algorithms.oort:SelectOort"}, group="fedsim.selections")
BUILT_IN_SELECTIONS = tuple(SELECTIONS)

# the own [algorithm] keys of the selection policies that have some (for every algorithm, beside
# the algorithm's own keys), with their typed defaults and ranges, as for the algorithms above
SELECTION_OPTIONS = {
    # power-of-choice's d (0: twice the devices invited, the smallest d of Cho et al.'s experiments)
    "power-of-choice": {"candidates": 0},
    # Oort (Lai et al. 2021) with FedScale's defaults (fedscale/cloud/config_parser.py)
    "oort": {"oort_exploration_factor": 0.9, "oort_exploration_decay": 0.98, "oort_exploration_min": 0.3,
             "oort_round_threshold": 30.0, "oort_round_penalty": 2.0, "oort_clip_bound": 0.9,
             "oort_cut_off_util": 0.05, "oort_sample_window": 5.0, "oort_pacer_step": 20,
             "oort_pacer_delta": 5.0},
}
SELECTION_RANGES = {
    "power-of-choice": {"candidates": (0, math.inf, False, "devices asked for their local loss each round (d), "
                                       "at least the devices invited; 0 = twice those")},
    "oort": {"oort_exploration_factor": (0.0, 1.0, False, "share of the cohort explored at first (epsilon)"),
             "oort_exploration_decay": (0.0, 1.0, False, "epsilon's factor per round"),
             "oort_exploration_min": (0.0, 1.0, False, "epsilon's floor"),
             "oort_round_threshold": (0.0, 100.0, True, "percentile of the reported durations that is the "
                                                        "preferred round duration T; 100 = no penalty"),
             "oort_round_penalty": (0.0, math.inf, False, "alpha of the penalty (T / t_i)^alpha"),
             "oort_clip_bound": (0.0, 1.0, False, "quantile at which utilities are clipped"),
             "oort_cut_off_util": (0.0, 1.0, False, "exploitation draws among utilities above this share "
                                                    "of the K-th highest"),
             "oort_sample_window": (1.0, math.inf, False, "exploration draws among this many times as many "
                                                          "unexplored devices as it invites"),
             "oort_pacer_step": (1, math.inf, False, "W, the pacer's window, in rounds"),
             "oort_pacer_delta": (0.0, 100.0, False, "percentile points the pacer moves round_threshold by")},
}

# which trace devices a run replays when the trace has more than [data] clients
TRACE_SELECTIONS = Registry("a trace device selection", callable, _paths("fedsim.runs.replay", {
    "random": "select_random", "first": "select_first", "most-available": "select_most_available"}))

__all__ = ["ALGORITHMS", "ALGORITHM_OPTIONS", "ALGORITHM_RANGES", "ALGORITHM_CHOICES", "BUILT_IN_ALGORITHMS", "MODELS", "GENERATORS", "CONVERTERS", "PARTITIONS", "SCHEDULES",
           "TRAINERS", "SELECTIONS", "BUILT_IN_SELECTIONS", "SELECTION_OPTIONS", "SELECTION_RANGES", "TRACE_SELECTIONS"]
