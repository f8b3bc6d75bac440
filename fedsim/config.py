"""Typed run configuration: TOML file + ``--set section.key=value`` overrides, validated.

Every key a user can write is a dataclass field below (or an option declared by the chosen
trace generator / algorithm), so unknown keys and wrong types are caught before anything
runs, with the closest valid key suggested.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fedsim.catalog import ALGORITHMS, GENERATORS, PARTITIONS, SCHEDULES, SELECTIONS, TRAINERS
from fedsim.errors import FedsimError, choice_error, did_you_mean


@dataclass
class RunConfig:
    name: str = "run"
    out: str = "runs"
    seed: int = 0
    rounds: int = 100
    max_time: float = 0.0  # simulated seconds; 0 = no limit
    eval_every: int = 10
    device: str = "auto"  # auto | cpu | cuda
    threads: str | int = "auto"  # torch intra-op threads: auto (by each call's work) or N
    algorithms: list = field(default_factory=list)  # several algorithms, same trace/data/seed
    checkpoint_every: int = 0  # rounds between checkpoints; 0 = only at the end
    progress: bool = True


@dataclass
class DataConfig:
    dataset: str = "digits"
    root: str = ""  # dataset folder; "" = the dataset's default location
    download: bool = False
    clients: int = 100
    partition: str = "iid"  # iid | dirichlet | classes | one-class | majority
    alpha: float = 0.5  # dirichlet concentration
    classes_per_client: int = 2
    size_sigma: float = 0.3  # one-class: relative spread of the normal client sizes
    majority: float = 0.95  # majority: fraction of a client's samples with its majority label
    test_fraction: float = 0.25  # datasets without a test split (digits, logistic)
    targets: list = field(default_factory=list)  # quadratic: one target vector per client
    dim: int = 2  # quadratic / logistic: dimension when no targets are given
    noise: float = 0.0  # quadratic: std of the gradient noise
    samples: int = 5000  # logistic: number of synthetic samples (train + test)
    classes: int = 10  # logistic: number of classes


@dataclass
class ModelConfig:
    name: str = "logreg"  # logreg | mlp | lenet5 | cnn-* | lstm (ignored by quadratic)
    hidden: int = 64  # mlp width
    dropout: float = 0.0
    init: list = field(default_factory=list)  # quadratic: x0 (default zeros)


@dataclass
class TraceConfig:
    source: str = "always"  # file | always | bernoulli | diurnal | ...
    path: str = ""  # source = "file"
    days: float = 0.0  # wall-clock generators: length; 0 = long enough for the run
    devices_table: str = ""  # optional devices.parquet feeding the timing model
    options: dict = field(default_factory=dict)  # the generator's own keys


@dataclass
class ServerConfig:
    mode: str = "sync"  # sync | async
    clients_per_round: int = 0  # 0 = every online device
    overcommit: float = 0.0  # invite ceil(K * (1 + overcommit)), keep the first K
    deadline: float = 600.0  # seconds after the round start
    timing: str = "model"  # model | ideal
    round_duration: float = 60.0  # ideal timing: round r spans [r*D, (r+1)*D)
    buffer: int = 10  # async: aggregate every `buffer` arrivals
    concurrency: int = 20  # async: devices kept training


@dataclass
class ClientConfig:
    local_steps: int = 5
    batch_size: int = 32  # 0 = the full local data (exact gradient)
    lr: float = 0.05
    lr_schedule: str = "constant"  # constant | inverse | inverse-sqrt | step
    lr_step_every: int = 100  # step schedule: rounds between decays
    lr_step_gamma: float = 0.5  # step schedule: decay factor
    weight_decay: float = 0.0
    clip: float = 0.0  # max gradient L2 norm per step; 0 = off
    trainer: str = "auto"  # auto | batched | loop


@dataclass
class AlgorithmConfig:
    name: str = "fedavg"
    server_lr: float = 1.0
    server_optimizer: str = "sgd"  # sgd | momentum | adam: how the update reaches the model
    server_momentum: float = 0.9  # momentum: m <- momentum * m + g
    server_beta1: float = 0.9  # adam (FedAdam): first-moment decay
    server_beta2: float = 0.99  # adam: second-moment decay
    server_eps: float = 1e-3  # adam: tau, added to sqrt(v)
    selection: str = ""  # "" = the algorithm's default policy
    options: dict = field(default_factory=dict)  # the algorithm's own keys


@dataclass
class DevicesConfig:
    model: str = "lognormal"  # constant | lognormal | table
    seconds_per_sample: float = 0.002  # median compute time per training sample
    bandwidth_bps: float = 1.0e6  # median link speed, bits per second
    latency_s: float = 0.1  # per transfer
    compute_sigma: float = 0.5  # lognormal spread of seconds_per_sample across devices
    bandwidth_sigma: float = 0.5  # lognormal spread of bandwidth across devices


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

    def to_dict(self) -> dict:
        """Plain nested dict, with generator/algorithm options folded back into their sections."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "source":
                continue
            section = dataclasses.asdict(getattr(self, f.name))
            section.update(section.pop("options", {}))
            out[f.name] = section
        return out

    def with_algorithm(self, name: str) -> "Config":
        """A copy running `name` (options of the configured algorithm that `name` lacks are dropped)."""
        valid = algorithm_options(name)
        algo = dataclasses.replace(
            self.algorithm,
            name=name,
            options={k: v for k, v in self.algorithm.options.items() if k in valid},
        )
        return dataclasses.replace(self, algorithm=algo, run=dataclasses.replace(self.run, algorithms=[]))


# what a resumed run may change: how long it goes on and how it is watched, never what is
# simulated (that would silently mix two experiments in one run directory)
RESUME_KEYS = ("run.rounds", "run.max_time", "run.eval_every", "run.checkpoint_every",
               "run.progress", "run.device")


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
CHOICES = {
    ("run", "device"): ("auto", "cpu", "cuda"),
    ("data", "partition"): PARTITIONS,
    ("server", "mode"): ("sync", "async"),
    ("server", "timing"): ("model", "ideal"),
    ("client", "lr_schedule"): SCHEDULES,
    ("client", "trainer"): TRAINERS,
    ("algorithm", "selection"): SELECTIONS,  # or "": the algorithm's default policy
    ("algorithm", "server_optimizer"): ("sgd", "momentum", "adam"),
    ("devices", "model"): ("constant", "lognormal", "table"),
}
POSITIVE = {  # > 0 (integers: >= 1)
    ("run", "rounds"), ("run", "eval_every"),
    ("data", "clients"), ("data", "alpha"), ("data", "classes_per_client"), ("data", "dim"),
    ("data", "samples"), ("data", "classes"), ("model", "hidden"),
    ("server", "deadline"), ("server", "round_duration"), ("server", "buffer"),
    ("server", "concurrency"),
    ("client", "local_steps"), ("client", "lr"), ("client", "lr_step_every"),
    ("client", "lr_step_gamma"), ("algorithm", "server_lr"), ("algorithm", "server_eps"),
    ("devices", "bandwidth_bps"),
}
NON_NEGATIVE = {
    ("run", "seed"), ("run", "max_time"), ("run", "checkpoint_every"),
    ("data", "size_sigma"), ("data", "noise"),
    ("server", "clients_per_round"), ("server", "overcommit"),
    ("client", "batch_size"), ("client", "weight_decay"), ("client", "clip"),
    ("devices", "seconds_per_sample"), ("devices", "latency_s"), ("devices", "compute_sigma"),
    ("devices", "bandwidth_sigma"), ("trace", "days"),
}
# (low, high, low included, high included): fractions and rates
RANGES = {
    ("data", "majority"): (0.0, 1.0, True, True),
    ("data", "test_fraction"): (0.0, 1.0, False, False),
    ("model", "dropout"): (0.0, 1.0, True, False),
    ("algorithm", "server_momentum"): (0.0, 1.0, True, False),
    ("algorithm", "server_beta1"): (0.0, 1.0, True, False),
    ("algorithm", "server_beta2"): (0.0, 1.0, True, False),
}
WORD_OR_COUNT = {("run", "threads")}  # a word ("auto") or a whole number
# what a boundary value means, said with the error so that the fix is obvious
MEANING = {
    ("run", "max_time"): "0 = no limit",
    ("run", "checkpoint_every"): "0 = only at the end",
    ("server", "clients_per_round"): "0 = every online device",
    ("client", "batch_size"): "0 = the full local data",
    ("client", "clip"): "0 = off",
    ("trace", "days"): "0 = long enough for the run",
}


def suggest(key: str, valid) -> str:
    """The end of an error line about an unknown `key`: the closest valid name, or all of them."""
    return did_you_mean(key, valid) or "valid keys: " + ", ".join(sorted(valid))


def algorithm_options(name: str, origin: str = "") -> dict[str, Any]:
    """The algorithm's own config keys with their typed defaults (FedsimError if unknown)."""
    where = f"{origin}: [algorithm] name" if origin else "[algorithm] name"
    return dict(ALGORITHMS.lookup(name, where).options)


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


def _check_value(where: str, section: str, key: str, value: Any) -> None:
    """Rules of one typed value: choices, signs, ranges, the run name, the algorithm list."""
    if isinstance(value, float) and not math.isfinite(value):
        raise FedsimError(f"{where} = {value!r} must be a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise FedsimError(f"{where} = {value!r} is too large (it must fit in 64 bits)")
    choices = CHOICES.get((section, key))
    if choices is not None and value not in choices and (value, key) != ("", "selection"):
        raise choice_error(where, value, list(choices), "is not valid")
    meaning = f" ({MEANING[(section, key)]})" if (section, key) in MEANING else ""
    if (section, key) in POSITIVE and not value > 0:
        raise FedsimError(f"{where} = {value!r} must be {'>= 1' if isinstance(value, int) else '> 0'}")
    if (section, key) in NON_NEGATIVE and not value >= 0:
        raise FedsimError(f"{where} = {value!r} must be >= 0{meaning}")
    if (section, key) in RANGES:
        low, high, low_in, high_in = RANGES[(section, key)]
        above = value >= low if low_in else value > low
        below = value <= high if high_in else value < high
        if not (above and below):
            interval = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
            raise FedsimError(f"{where} = {value!r} must be in {interval}")
    if (section, key) == ("run", "threads") and value != "auto" and not (isinstance(value, int) and value >= 1):
        raise FedsimError(f"{where} = {value!r} must be \"auto\" (chosen by each call's work) "
                          "or a number of threads >= 1")
    if (section, key) == ("run", "name"):
        if not value.strip() or value in (".", "..") or "/" in value or "\\" in value:
            raise FedsimError(
                f"{where} = {value!r} is not a folder name; give a plain name without '/' or '\\' "
                "(the run directory is [run] out / name; put the parent folders in [run] out)"
            )
    if (section, key) == ("run", "algorithms"):
        for name in value:
            if not isinstance(name, str):
                raise FedsimError(f"{where}: algorithm names must be strings, got {name!r}")
        repeated = next((name for i, name in enumerate(value) if name in value[:i]), None)
        if repeated is not None:
            raise FedsimError(
                f"{where} lists {repeated!r} more than once; name each algorithm once "
                "(each one runs into a sub-folder named after it)"
            )


def _declared_options(section: str, raw: dict, algorithms: list, origin: str) -> dict[str, Any] | None:
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
        for name in [raw.get("name", AlgorithmConfig.name), *algorithms]:
            if not isinstance(name, str):
                raise FedsimError(f"{origin}: algorithm names must be strings, got {name!r}")
            options.update(algorithm_options(name, origin=origin))
        return options
    return None


def _build_section(section: str, raw: dict, algorithms: list, origin: str):
    cls = _SECTION_CLASSES[section]
    fields = {f.name for f in dataclasses.fields(cls) if f.name != "options"}
    extra = _declared_options(section, raw, algorithms, origin)
    defaults = cls()
    kwargs, options = {}, {}
    for key, value in raw.items():
        where = f"{origin}: [{section}] {key}"
        if key in fields:
            if not ((section, key) in WORD_OR_COUNT and type(value) is int):
                value = _check_type(where, value, getattr(defaults, key))
            _check_value(where, section, key, value)
            kwargs[key] = value
        elif extra is not None and key in extra:
            default = extra[key]
            options[key] = value if default is None else _check_type(where, value, default)
        else:
            owner = raw.get("source") if section == "trace" else raw.get("name")
            scope = f" for {owner!r}" if extra is not None and owner else ""
            raise FedsimError(
                f"{origin}: unknown key [{section}] {key}{scope}; "
                f"{suggest(key, [*fields, *(extra or {})])}"
            )
    if extra is not None:
        kwargs["options"] = options
    return cls(**kwargs)


def config_from_dict(raw: dict, origin: str = "<config>") -> Config:
    """Validate a nested dict (as parsed from TOML) into a Config."""
    for section, body in raw.items():
        if section not in _SECTION_CLASSES:
            raise FedsimError(
                f"{origin}: unknown section [{section}]; {suggest(section, _SECTION_CLASSES)}"
            )
        if not isinstance(body, dict):
            raise FedsimError(f"{origin}: '{section}' must be a [{section}] table, got {body!r}")
    raw = _with_model_defaults(raw)
    algorithms = raw.get("run", {}).get("algorithms", [])
    if not isinstance(algorithms, list):
        raise FedsimError(f"{origin}: [run] algorithms must be a list of names, got {algorithms!r}")
    built = {
        section: _build_section(section, raw.get(section, {}), algorithms, origin)
        for section in _SECTION_CLASSES
    }
    config = Config(**built, source=origin)
    _check_consistency(config)
    return config


# [model] keys whose default is that of the paper's architecture of the name: FedAWE's
# Table 6 puts dropout 0.2 before every dense layer of its CINIC-10 CNN
MODEL_DEFAULTS = {"cnn-cinic": {"dropout": 0.2}}


def _with_model_defaults(raw: dict) -> dict:
    model = raw.get("model", {})
    name = model.get("name")
    defaults = MODEL_DEFAULTS.get(name, {}) if isinstance(name, str) else {}
    return {**raw, "model": {**defaults, **model}} if defaults else raw


def _check_consistency(config: Config) -> None:
    """Cross-key rules that no single field can check."""
    origin = config.source
    if config.trace.source == "file" and not config.trace.path:
        raise FedsimError(f"{origin}: [trace] source = 'file' needs [trace] path = 'trace.parquet'")
    if config.server.mode == "async" and config.server.timing == "ideal":
        raise FedsimError(f"{origin}: [server] mode = 'async' needs timing = 'model' (ideal timing "
                          "is the papers' synchronous round model)")
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
    if config.data.dataset == "quadratic" and config.data.targets:
        if len(config.data.targets) != config.data.clients:
            raise FedsimError(
                f"{origin}: [data] targets has {len(config.data.targets)} entries but "
                f"[data] clients = {config.data.clients}; give one target per client"
            )


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value); value is a TOML literal or a bare string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise FedsimError(f"--set {text!r}: expected section.key=value, e.g. --set run.rounds=50")
    path, literal = text.split("=", 1)
    section, key = path.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {literal}")["v"]
    except tomllib.TOMLDecodeError:
        value = literal
    return section, key.strip(), value


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise FedsimError(f"config {path}: no such file; pass an existing .toml file or a scenario name")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise FedsimError(f"config {path}: invalid TOML ({err})") from None
    except UnicodeDecodeError:
        raise FedsimError(f"config {path}: not UTF-8 text; save the TOML file as UTF-8") from None
    except OSError as err:
        raise FedsimError(f"config {path}: cannot read it ({err.strerror}); "
                          "pass a readable .toml file or a scenario name") from None


def scenario_names() -> list[str]:
    files = resources.files("fedsim.scenarios").iterdir()
    return sorted(p.name[:-5] for p in files if p.name.endswith(".toml"))


def scenario_path(name: str) -> Path:
    return Path(str(resources.files("fedsim.scenarios").joinpath(f"{name}.toml")))


def load_config(source: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Load a config file (or a built-in scenario by name; None = quickstart) plus overrides."""
    if source is None:
        source = "quickstart"
    if not isinstance(source, (str, Path)):
        raise FedsimError(f"load_config: expected a config path or scenario name, got {source!r}")
    if isinstance(overrides, str) or not all(isinstance(o, str) for o in overrides):
        raise FedsimError(f"load_config: overrides must be a list of 'section.key=value' strings, "
                          f"got {overrides!r}")
    path = Path(source)
    if not path.exists() and str(source) in scenario_names():
        path = scenario_path(str(source))
    raw = read_toml(path)
    for text in overrides:
        section, key, value = parse_override(text)
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise FedsimError(f"--set {text!r}: [{section}] is not a table")
        raw[section][key] = value
    return config_from_dict(raw, origin=str(path))


def dump_toml(sections: dict[str, dict[str, Any]]) -> str:
    """TOML text of a two-level dict (the resolved config written to the run directory), by
    tomli-w, which escapes what a hand-written writer missed (a newline in a run name)."""
    import tomli_w

    return tomli_w.dumps(sections)
