"""The catalogue of bad inputs: every one gets exit status 2 and ONE line on stderr, `error: `
followed by what is wrong, where, and how to fix it; no traceback, and nothing that was there
before is deleted or changed.

Each case is a command line (`{tmp}` stands for the test's folder, also the working
directory), the files it needs there, and a regular expression the line must match.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import quadratic_config  # noqa: E402
from leaf_files import write_leaf  # noqa: E402

from fedsim.cli import main  # noqa: E402
from fedsim.config import dump_toml  # noqa: E402
from fedsim.training.rules import CURRENT as CURRENT_RULES  # noqa: E402

META = {"fedsim.trace.version": "1", "n_devices": "3", "horizon": "100.0"}
GOOD = {"device_id": [0, 1, 2], "start": [0.0, 10.0, 5.0], "end": [50.0, 90.0, 100.0]}
QUADRATIC = quadratic_config([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]], rounds=2)


def trace(columns=None, meta=None, **change):
    """A trace file with exactly these columns and metadata (unchecked): GOOD with `change`."""
    def write(path, run):
        table = pa.table(columns if columns is not None else {**GOOD, **change})
        pq.write_table(table.replace_schema_metadata(META if meta is None else meta), path)
    return write


def config(trace_path: str | None = None, **sections) -> str:
    """A quadratic config (3 devices, 2 rounds) as TOML, `sections` merged in."""
    body = {section: dict(keys) for section, keys in QUADRATIC.items()}
    body["run"].update(out="{tmp}/runs", name="t", progress=False, plots=False)
    if trace_path:
        body["trace"] = {"source": "file", "path": trace_path}
    for section, keys in sections.items():
        body.setdefault(section, {}).update(keys)
    return dump_toml(body)


def run_dir(change=None):
    """A copy of a finished quadratic run, then `change(folder)`."""
    def write(path, run):
        shutil.copytree(run, path)
        if change:
            change(path)
    return write


def diverged(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "status": "diverged", "reason": "loss nan"}))


def with_initial(folder: Path, initial) -> None:
    """The run's manifest with `initial` (the initial model's evaluation) replaced."""
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "initial": initial}))


def case(name: str, argv: str, says: str, **files):
    """A bad input: `fedsim ARGV` (split on spaces) in a folder holding `files` (text, bytes,
    or a function(path, finished_run) writing it); `says`: a regex for its line."""
    return pytest.param(argv.split(), says, files, id=name)


def run_then_replace_trace(runs: Path, finished) -> None:
    """Run c.toml (which replays t.parquet), then write another trace over t.parquet."""
    assert main(["run", str(runs.parent / "c.toml"), "--quiet"]) == 0
    trace(end=[50.0, 90.0, 99.0])(runs.parent / "t.parquet", finished)


def async_run_as_before(runs: Path) -> None:
    """Run c.toml (async), then drop its checkpoint's server state, as releases before async
    runs resumed wrote it."""
    import torch

    assert main(["run", str(runs.parent / "c.toml"), "--quiet"]) == 0
    state = torch.load(runs / "t" / "checkpoint.pt", weights_only=False)
    del state["server"]
    torch.save(state, runs / "t" / "checkpoint.pt")


def idx_files(folder: Path) -> None:
    """The four MNIST-format files, the first of them cut short."""
    import gzip

    folder.mkdir()
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (folder / f"{stem}.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x03\x00\x00"))


ACCURACY_CLAIM = ('[[claims]]\nclaim = "mifa beats fedavg"\nmetric = "final_acc"\nbetter = {"algorithm.name" = "mifa"}\n'
                  'than = {"algorithm.name" = "fedavg"}\n')


def quadratic_study(claims: str = "") -> str:
    """A study of the quadratic task: fedavg and mifa, seeds 0 and 1 (and `claims`)."""
    return config() + '[sweep]\n"algorithm.name" = ["fedavg", "mifa"]\n"run.seed" = [0, 1]\n' + claims


def swept_then_claimed(path: Path, run) -> None:
    """runs/ holding a quadratic study swept without claims, then given an accuracy claim in its
    study.toml (as a release that did not check the metric recorded it)."""
    tmp = path.parent
    (tmp / "s.toml").write_text(quadratic_study().replace("{tmp}", str(tmp)))
    assert main(["sweep", str(tmp / "s.toml"), "--quiet"]) == 0
    recorded = path / "t" / "study.toml"
    recorded.write_text(recorded.read_text() + "\n" + ACCURACY_CLAIM)


def swept_then_replaced(*change: str):
    """runs/ holding study t, whose study.toml is then replaced by that of s.toml run with
    `change` (--set lines) as study u."""
    def write(path, run):
        swept()(path, run)
        assert main(["sweep", str(path.parent / "s.toml"), "--quiet", "--set", "run.name=u", *change]) == 0
        shutil.copy(path / "u" / "study.toml", path / "t" / "study.toml")
    return write


def swept_then_unrecorded(path: Path, run) -> None:
    """runs/ holding study t without its study.toml (deleted, as a damaged one is)."""
    swept()(path, run)
    (path / "t" / "study.toml").unlink()


def extends_chain(path: Path, run) -> None:
    """c.toml extends e1.toml, which extends e2.toml, ... e1199.toml: 1,200 files."""
    for k in range(1199):
        (path.parent / f"e{k}.toml").write_text(f'extends = "e{k + 1}.toml"\n' if k < 1198 else "[run]\nrounds = 1\n")
    path.write_text('extends = "e0.toml"\n')


def leaf(change):
    """FEMNIST in LEAF's files (users u0 and u1), then `change(train, test)` on their JSON."""
    def write(path, run):
        write_leaf(path, "femnist", [[3, 2]])
        files = [path / "train" / "all_data_0_train.json", path / "test" / "all_data_0_test.json"]
        data = [json.loads(f.read_text()) for f in files]
        change(*data)
        for file, body in zip(files, data):
            file.write_text(json.dumps(body))
    return write


def no_users(data: dict) -> None:
    data.update(users=[], num_samples=[], user_data={})


def parquet_data(train: dict, test: dict | None = None):
    """A Parquet federated dataset: pq/train.parquet (and pq/test.parquet) with these columns."""
    def write(path, run):
        path.mkdir()
        for name, columns in (("train", train), ("test", test)):
            if columns is not None:
                pq.write_table(pa.table(columns), path / f"{name}.parquet")
    return write


def samples(x, **columns) -> dict:
    """The columns of four rows (users a, a, b, b; labels 0, 1, 0, 1) with features x."""
    return {"user": ["a", "a", "b", "b"], "label": [0, 1, 0, 1], "x": x, **columns}


def png(mode: str = "L") -> bytes:
    """A 4 x 4 PNG (grey by default)."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new(mode, (4, 4)).save(out, format="PNG")
    return out.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG that says it is that large (what a reader sees before it decodes) and holds one
    row of pixels: a few bytes, however large it says it is."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(bytes(width + 1))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def manifest_says(**fields):
    """A run_dir change: its manifest.json with these fields."""
    def change(folder: Path) -> None:
        manifest = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps({**manifest, **fields}))
    return change


def checkpoint_says(**fields):
    """A run_dir change: its checkpoint.pt with these fields."""
    def change(folder: Path) -> None:
        import torch

        state = torch.load(folder / "checkpoint.pt", weights_only=False)
        torch.save({**state, **fields}, folder / "checkpoint.pt")
    return change


def swept(change=None, claims: str = ""):
    """runs/ holding the quadratic study t (fedavg and mifa, seeds 0 and 1, from s.toml), then
    `change(study folder)`."""
    def write(path: Path, run) -> None:
        (path.parent / "s.toml").write_text(quadratic_study(claims).replace("{tmp}", str(path.parent)))
        assert main(["sweep", str(path.parent / "s.toml"), "--quiet"]) == 0
        if change:
            change(path / "t")
    return write


def compared(change=None):
    """runs/t: a comparison of fedavg and mifa on the quadratic task, then `change(folder)`."""
    def write(path: Path, run) -> None:
        (path.parent / "cmp.toml").write_text(config(run={"algorithms": ["fedavg", "mifa"]}).replace("{tmp}", str(path.parent)))
        assert main(["run", str(path.parent / "cmp.toml"), "--quiet"]) == 0
        if change:
            change(path / "t")
    return write


def trace_picture(path: Path, run) -> None:
    """A copy of the finished run with trace.png, drawn in it by `fedsim trace plot`."""
    run_dir()(path, run)
    assert main(["trace", "plot", str(path), "--out", str(path / "trace.png")]) == 0


def module_file(body: str) -> str:
    """A module file of the user's: torch, nn and sys imported, then `body`."""
    return "import sys\nimport torch\nfrom torch import nn\n\n" + body


DIGITS = config(data={"dataset": "digits", "clients": 3, "targets": []})


NETS = """
import torch
from torch import nn

WIDTH = 64


def linear(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(WIDTH, n_classes))


def batchnorm(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(WIDTH, n_classes), nn.BatchNorm1d(n_classes))


def batchnorm_average(in_shape, n_classes, cfg):  # (a cumulative average: no kernel, through torch.func)
    return nn.Sequential(nn.Flatten(), nn.Linear(WIDTH, n_classes), nn.BatchNorm1d(n_classes, momentum=None))


def raises(in_shape, n_classes, cfg):
    raise RuntimeError("the weights are on another machine")


def returns_none(in_shape, n_classes, cfg):
    nn.Linear(WIDTH, n_classes)


def returns_class(in_shape, n_classes, cfg):
    return nn.Linear


def returns_list(in_shape, n_classes, cfg):
    return [nn.Flatten(), nn.Linear(WIDTH, n_classes)]


def two_args(in_shape, n_classes):
    return linear(in_shape, n_classes, None)


def frozen(in_shape, n_classes, cfg):
    return linear(in_shape, n_classes, cfg).requires_grad_(False)


def complex_linear(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(WIDTH, n_classes, dtype=torch.cfloat))


def meta_linear(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(WIDTH, n_classes, device="meta"))


class Tuple(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.fc = nn.Linear(WIDTH, n_classes)

    def forward(self, x):
        logits = self.fc(x.flatten(1))
        return logits, logits.mean()


def returns_tuple(in_shape, n_classes, cfg):
    return Tuple(n_classes)


def three_classes(in_shape, n_classes, cfg):
    return nn.Sequential(nn.Flatten(), nn.Linear(WIDTH, 3))


class Integer(Tuple):
    def forward(self, x):
        return self.fc(x.flatten(1)).round().long()


def integer_logits(in_shape, n_classes, cfg):
    return Integer(n_classes)


def nan_linear(in_shape, n_classes, cfg):
    model = linear(in_shape, n_classes, cfg)
    torch.nn.init.constant_(model[1].bias, float("nan"))
    return model


class Noisy(Tuple):
    def forward(self, x):
        return self.fc(x.flatten(1) + torch.randn_like(x.flatten(1)))


def noisy(in_shape, n_classes, cfg):
    return Noisy(n_classes)


def huge_buffer(in_shape, n_classes, cfg):
    model = linear(in_shape, n_classes, cfg)
    model.register_buffer("hash", torch.tensor([7, 2**40]))
    return model


def forward_of(fn, **buffers):  # the factory of a module of one Linear layer fc: forward is fn(self, x flattened)
    class Net(Tuple):
        def __init__(self, n_classes):
            super().__init__(n_classes)
            for name, value in buffers.items():
                self.register_buffer(name, value)

        def forward(self, x):
            return fn(self, x.flatten(1))
    return lambda in_shape, n_classes, cfg: Net(n_classes)


def _clamped(self, x):
    self.fc.weight.data.clamp_(-1, 1)
    return self.fc(x)


def _nudged(self, x):
    with torch.no_grad():
        self.fc.bias.add_(1e-3)
    return self.fc(x)


def _data_set(self, x):
    self.fc.weight.data = self.fc.weight.data.clamp(-1, 1)
    return self.fc(x)


def _weight_replaced(self, x):
    self.fc.weight = nn.Parameter(self.fc.weight.detach() * 0.5)
    return self.fc(x)


def _buffer_replaced(self, x):
    self.mean = 0.9 * self.mean + 0.1 * x.mean(0)
    return self.fc(x - self.mean)


def _counted(self, x):
    self.calls = getattr(self, "calls", 0) + 1
    return self.fc(x) * (1 + 0.01 * (self.calls % 3))


clamped, nudged, data_set, weight_replaced, counted = map(
    forward_of, (_clamped, _nudged, _data_set, _weight_replaced, _counted))
buffer_replaced = forward_of(_buffer_replaced, mean=torch.zeros(WIDTH))
masked = forward_of(lambda self, x: self.fc(x) + x[x > 0].sum())
nonzero = forward_of(lambda self, x: self.fc(x) + torch.nonzero(x).shape[0] * 0.0)
unique = forward_of(lambda self, x: self.fc(x) + torch.unique(x).sum())
branches = forward_of(lambda self, x: self.fc(x if x.sum() > 0 else -x))
item = forward_of(lambda self, x: self.fc(x) * x.abs().max().item())
tolist = forward_of(lambda self, x: self.fc(x) + sum(x.mean(1).tolist()))
as_float = forward_of(lambda self, x: self.fc(x) * float(x.std()))
"""


def python(text: str):
    """A module file of `text`, compiled beforehand, so that importing it writes no file."""
    def write(path: Path, run) -> None:
        import importlib.util
        import py_compile

        path.write_text(text)
        py_compile.compile(str(path), cfile=importlib.util.cache_from_source(str(path)))
    return write


nets = python(NETS)


def digits(**sections) -> str:
    """A config of digits on 3 devices (1 local step of 4 samples a round), `sections` merged in."""
    body = {"data": {"dataset": "digits", "clients": 3, "targets": []}, "client": {"batch_size": 4}}
    for section, keys in sections.items():
        body[section] = {**body.get(section, {}), **keys}
    return config(**body)


def module_config(name: str, client=None, **model) -> str:
    return digits(model={"name": name, **model}, **({"client": client} if client else {}))


def user_module(factory: str, client=None, **model) -> dict:
    """The files of a run of NETS's `factory`: c.toml and audit_nets.py."""
    return {"c.toml": module_config(f"audit_nets:{factory}", client, **model), "audit_nets.py": nets}


def saved(value):
    """A model.pt holding `value`: a dict of named tensors, or a list of them (numbers become tensors)."""
    def write(path, run):
        import torch

        tensors = ({k: v if isinstance(v, torch.Tensor) else torch.tensor(v) for k, v in value.items()}
                   if isinstance(value, dict) else [torch.tensor(v) for v in value])
        torch.save(tensors, path)
    return write


def comparison(path: Path, run) -> None:
    """A comparison's folder: a run of each of two algorithms."""
    for name in ("fedavg", "mifa"):
        shutil.copytree(run, path / name)


def study_folder(path: Path, run) -> None:
    """A study's folder: study.toml and two point folders."""
    path.mkdir()
    (path / "study.toml").write_text('base = "quickstart"\n[sweep]\n"run.seed" = [0, 1]\n')
    for name in ("seed-0", "seed-1"):
        shutil.copytree(run, path / name)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def edit_manifest(run: Path, **change) -> None:
    (run / "manifest.json").write_text(json.dumps({**read_json(run / "manifest.json"), **change}))


def run_then(change):
    """Run c.toml, then `change(its run directory)`."""
    def write(runs: Path, finished) -> None:
        assert main(["run", str(runs.parent / "c.toml"), "--quiet"]) == 0
        change(runs / "t")
    return write


RUN = "run {tmp}/c.toml --quiet"
ISO_CSV = "device_id,start,end\n0,2024-01-01T00:00:00,2024-01-01T01:00:00\n1,2024-01-01T00:10:00,2024-01-01T02:00:00\n"
PARQUET = config(data={"dataset": "parquet", "root": "{tmp}/pq", "clients": 2, "client_column": "user",
                       "label_column": "label", "feature_column": "x", "targets": []}, model={"name": "logreg"})
LEAF = config(data={"dataset": "femnist", "root": "{tmp}/leaf", "clients": 2, "targets": []}, model={"name": "logreg"})
CONVERT = "trace convert --from csv {tmp}/in.csv --out {tmp}/out.parquet"

CASES = [
    # --- config: keys, types, ranges, names --------------------------------------------------
    case("unknown-key", RUN, r"unknown key \[client\] local_step.*did you mean 'local_steps'",
         **{"c.toml": "[client]\nlocal_step = 3\n"}),
    case("unknown-section", RUN, r"unknown section \[clients\].*'client'", **{"c.toml": "[clients]\nlr = 0.1\n"}),
    case("unknown-key-by-set", "run quickstart --set server.dedline=5", r"did you mean 'deadline'"),
    case("string-for-int", RUN, r"\[run\] rounds.*expected an integer", **{"c.toml": "[run]\nrounds = 'many'\n"}),
    case("bool-for-int", "run quickstart --set run.rounds=true", r"\[run\] rounds.*expected an integer"),
    case("list-for-float", "run quickstart --set client.lr=[1]", r"\[client\] lr.*expected a number"),
    case("section-not-a-table", RUN, r"'run' must be a \[run\] table", **{"c.toml": "run = 5\n"}),
    case("negative-clients", "run quickstart --set data.clients=-3", r"\[data\] clients = -3 must be >= 1"),
    case("zero-local-steps", "run quickstart --set client.local_steps=0", r"\[client\] local_steps = 0 must be >= 1"),
    case("negative-lr", "run quickstart --set client.lr=-1", r"\[client\] lr = -1\.0 must be > 0"),
    case("negative-checkpoint-every", "run quickstart --set run.checkpoint_every=-1",
         r"\[run\] checkpoint_every = -1 must be >= 0"),
    case("test-fraction-above-1", "run quickstart --set data.test_fraction=1.5",
         r"\[data\] test_fraction = 1\.5 must be in \(0, 1\)"),
    case("majority-above-1", "run quickstart --set data.majority=2.0", r"\[data\] majority = 2\.0 must be in \[0, 1\]"),
    case("dropout-of-1", "run quickstart --set model.dropout=1.0", r"\[model\] dropout = 1\.0 must be in \[0, 1\)"),
    case("gamma-above-1", "run quickstart --set client.lr_step_gamma=5", r"\[client\] lr_step_gamma = 5.* must be in \(0, 1\]"),
    case("infinite-deadline", "run quickstart --set server.deadline=inf", r"\[server\] deadline = inf must be a finite number"),
    case("seed-beyond-64-bits", "run quickstart --set run.seed=99999999999999999999", r"is too large \(it must fit in a signed 64-bit integer: at most 9223372036854775807\)"),
    case("name-with-slash", "run quickstart --set run.name='a/b'", r"\[run\] name = 'a/b'.*folder name"),
    case("name-with-line-break", RUN, r"\[run\] name = 'a\\nb' is not a folder name; give a plain name without '/', "
         r"'\\' or line breaks", **{"c.toml": config(run={"name": "a\nb"})}),
    case("name-with-tab-by-set", r'run quickstart --set run.name="a\tb"', r"\[run\] name = 'a\\tb' is not a folder name"),
    case("study-name-with-line-break", "sweep {tmp}/s.toml", r"\[run\] name = 'a\\nb' is not a plain folder name; give a "
         r"name without '/', '\\' or line breaks", **{"s.toml": 'base = "quickstart"\n[run]\nname = "a\\nb"\n'
                                                               '[sweep]\n"run.seed" = [0, 1]\n'}),
    case("unknown-algorithm", "run quickstart --set algorithm.name='fedavgg'",
         r"\[algorithm\] name = 'fedavgg' is unknown; did you mean 'fedavg'"),
    case("unknown-model", "run quickstart --set model.name='resnet'", r"\[model\] name = 'resnet' is unknown"),
    case("unknown-trace-source", "run quickstart --set trace.source='nope'", r"\[trace\] source = 'nope' is unknown"),
    case("unknown-partition", "run quickstart --set data.partition='skewed'", r"\[data\] partition = 'skewed' is not valid \(one of: iid, dirichlet"),
    case("bad-timing-choice", "run quickstart --set server.timing='real'", r"one of: model, ideal"),
    case("algorithm-twice", "run quickstart --set run.algorithms=['mifa','mifa']", r"\[run\] algorithms lists 'mifa' more than once"),
    case("algorithms-not-a-list", "run quickstart --set run.algorithms='fedavg'", r"\[run\] algorithms must be a list of names"),
    case("target-above-1", "run quickstart --set run.targets=[1.5]", r"1\.5 is not an accuracy in \(0, 1\]"),
    case("diverge-loss-word", "run quickstart --set run.diverge_loss='sometimes'", r"must be \"auto\""),
    case("offset-not-a-time", "run quickstart --set trace.offset='noon'", r"\[trace\] offset = 'noon' is not a date-time"),
    case("targets-not-numbers", RUN, r"\[data\] targets: entry 1 = \['a'\] is not a list of finite numbers",
         **{"c.toml": config(data={"targets": [["a"]]})}),
    case("unknown-algorithm-option", RUN, r"unknown key \[algorithm\] cutof for 'fedau'.*cutoff",
         **{"c.toml": config(algorithm={"name": "fedau", "cutof": 3})}),
    case("file-source-without-path", RUN, r"\[trace\] source = 'file' needs \[trace\] path",
         **{"c.toml": config(trace={"source": "file"})}),
    case("partition-on-quadratic", RUN, r"partition = 'dirichlet' does not apply to the quadratic task",
         **{"c.toml": config(data={"partition": "dirichlet"})}),
    case("one-class-sizes-spread-too-far", RUN, r"partition = 'one-class' left \d+ of 20 clients without samples "
         r"\(\d+ training samples\); lower \[data\] clients, or lower \[data\] size_sigma",
         **{"c.toml": config(data={"dataset": "digits", "clients": 20, "partition": "one-class", "size_sigma": 50.0,
                                   "targets": []}, model={"name": "logreg"})}),
    case("async-with-ideal-timing", RUN, r"mode = 'async' needs timing = 'model'",
         **{"c.toml": config(server={"mode": "async"})}),
    case("more-per-round-than-devices", RUN, r"clients_per_round = 4 is more than the 3 devices",
         **{"c.toml": config(server={"clients_per_round": 4})}),
    case("clients-beyond-samples", "run quickstart --set data.clients=3000000 --set run.rounds=1",
         r"\[data\] clients = 3000000 is more than the 1347 training samples of 'digits'"),
    case("invalid-toml", RUN, r"config .*c\.toml: invalid TOML", **{"c.toml": "[run\nrounds = 1\n"}),
    case("config-not-utf8", RUN, r"not UTF-8 text", **{"c.toml": b"\xff\xfe[run]\n"}),
    case("set-without-equals", "run quickstart --set run.rounds", r"--set 'run\.rounds': expected section\.key=value"),
    case("set-bad-value", "run quickstart --set run.rounds=x", r"\[run\] rounds: expected an integer, got 'x'"),
    # --- CLI: arguments, missing files, resume ------------------------------------------------
    case("unknown-option", "run --bogus", r"fedsim run: unrecognized arguments: --bogus; see `fedsim run --help`$"),
    case("option-typo", "run --quite", r"^error: fedsim run: unrecognized arguments: --quite; did you mean '--quiet'\? "
         r"\(see `fedsim run --help`\)$"),
    case("generator-option-typo", "trace generate diurnal --devices 3 --days 1 --out {tmp}/x.parquet --availabilty 0.5",
         r"^error: fedsim trace generate: unrecognized arguments: --availabilty 0\.5; did you mean '--availability'\? "
         r"\(see `fedsim trace generate --help`\)$"),
    case("generator-option-by-set", "run quickstart --set trace.p_min=2",
         r"^error: --set trace\.p_min=2: trace generator 'bernoulli': p_min = 2; give a value in \[0\.0, 1\.0\]$"),
    case("name-in-capitals", "run quickstart --set model.name=MLP", r"\[model\] name = 'MLP' is unknown; did you mean "
         r"'mlp'\? "),
    case("command-typo", "rnu", r"invalid choice: 'rnu' \(choose from .*\); did you mean 'run'\? \(see `fedsim --help`\)$"),
    case("no-command", "", r"the following arguments are required: command"),
    case("no-devices", "trace generate diurnal --devices 0 --days 1 --out {tmp}/t.parquet",
         r"^error: --devices 0: give a number of devices >= 1$"),
    case("not-an-integer-argument", "trace generate always --devices x --days 1 --out {tmp}/t.parquet",
         r"fedsim trace generate: argument --devices: invalid int value: 'x'; see `fedsim trace generate --help`"),
    case("missing-config", "run {tmp}/nope.toml", r"config .*nope\.toml: no such file"),
    case("folder-as-config", "run {tmp}", r"config .*: cannot read it \(Is a directory\); pass a readable \.toml file"),
    case("resume-missing-folder", "run --resume {tmp}/nope", r"nope: no such run directory"),
    case("resume-and-config", "run quickstart --resume {tmp}/r", r"give a config or --resume RUN_DIR, not both"),
    case("resume-changes-lr", "run --resume {tmp}/r --set client.lr=1", r"client\.lr cannot be changed when resuming"),
    case("resume-typo", "run --resume {tmp}/r --set run.max_tim=60", r"^error: --set 'run\.max_tim=60': unknown key "
         r"run\.max_tim; did you mean 'run\.max_time'\?$"),
    case("algorithms-typo", 'run quickstart --set run.algorithms=["fedavg","scafold"]',
         r"^error: --set run\.algorithms=\[\"fedavg\",\"scafold\"\]: \[run\] algorithms = 'scafold' is unknown; did "
         r"you mean 'scaffold'\?"),
    case("resume-not-a-run", "run --resume {tmp}/empty", r"empty: no checkpoint\.pt", empty=lambda path, run: path.mkdir()),
    case("resume-fewer-rounds", "run --resume {tmp}/r --set run.rounds=1 --quiet", r"the run already has 2 rounds",
         r=run_dir()),
    case("resume-diverged", "run --resume {tmp}/r --quiet", r"the run diverged \(loss nan\).*--force", r=run_dir(diverged)),
    case("resume-without-config", "run --resume {tmp}/r --quiet", r"r/config\.toml: missing",
         r=run_dir(lambda path: (path / "config.toml").unlink())),
    case("resume-damaged-checkpoint", "run --resume {tmp}/r --quiet", r"checkpoint\.pt: not a readable checkpoint",
         r=run_dir(lambda path: (path / "checkpoint.pt").write_bytes(b"half a checkpoint"))),
    case("resume-edited-config", "run --resume {tmp}/r --quiet", r"\[client\] lr = 0\.5, but the run started with 0\.1",
         r=run_dir(lambda path: (path / "config.toml").write_text(
             (path / "config.toml").read_text().replace("lr = 0.1", "lr = 0.5")))),
    case("report-missing-folder", "report {tmp}/nope", r"nope: no such folder; pass the folder that `fedsim run` printed"),
    case("report-not-a-run", "report {tmp}/empty", r"empty: not a run directory \(no rounds\.parquet",
         empty=lambda path, run: path.mkdir()),
    case("plot-missing-folder", "plot {tmp}/nope", r"nope: no such folder; pass the folder that `fedsim run` printed"),
    case("report-missing-rounds", "report {tmp}/r", r"r: not a run directory \(no rounds\.parquet",
         r=run_dir(lambda path: (path / "rounds.parquet").unlink())),
    case("report-bad-target", "report {tmp}/r --target 1.5", r"1\.5", r=run_dir()),
    case("best-by-without-study", "report {tmp}/r --best-by final_acc --over client.lr", r"not a study folder \(no study\.toml\); --best-by and --over report on the folder of a study",
         r=run_dir()),
    case("plot-damaged-rounds", "plot {tmp}/r", r"rounds\.parquet: not a readable Parquet file",
         r=run_dir(lambda path: (path / "rounds.parquet").write_bytes(b"PAR1 broken"))),
    case("sweep-missing-study", "sweep {tmp}/nope.toml", r"nope\.toml: no such file"),
    case("grid-with-one-group", 'run quickstart --set trace.source="grid" --set trace.digits=10',
         r"trace generator 'grid': every device's most frequent label is below digits = 10 \(they are 0\.\.9\), so one "
         r"group is empty and nobody is online half the time; set \[trace\] digits between them \(e\.g\. 5\)$"),
    case("model-plugin-with-a-dot", 'run quickstart --set model.name="my_nets.make"',
         r"\[model\] name = 'my_nets\.make' is unknown; a plugin is named 'module:attribute': did you mean "
         r"'my_nets:make'\? \(built-in: logreg, mlp, "),
    case("sweep-name-axis", "sweep {tmp}/s.toml", r"\[sweep\] 'run\.name' cannot vary per point",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.name" = ["a", "b"]\n'}),
    case("sweep-algorithms-axis", "sweep {tmp}/s.toml", r"'run\.algorithms' cannot vary per point \(sweep \"algorithm\.name\"",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.algorithms" = [["fedavg"], ["mifa"]]\n'}),
    case("sweep-one-and-one-point-zero", "sweep {tmp}/s.toml", r"the point \{'algorithm\.name': 'fedavg', 'run\.seed': 1\.0\} comes twice \(1 and 1\.0 are one value\)",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [1, 1.0]\n'}),
    case("sweep-exact-duplicate", "sweep {tmp}/s.toml", r"the point \{'algorithm\.name': 'fedavg', 'run\.seed': 1\} comes twice; give",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [1, 1]\n'}),
    case("sweep-empty-axis-by-set", "sweep {tmp}/s.toml --set sweep.run.seed=[]",
         r"^error: --set sweep\.run\.seed=\[\]: \[sweep\] 'run\.seed' = \[\] must be a non-empty list",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [1, 2]\n'}),
    case("sweep-bad-name-by-set", "sweep {tmp}/s.toml --set run.name=a/b",
         r"^error: --set run\.name=a/b: \[run\] name = 'a/b' is not a plain folder name",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [1, 2]\n'}),
    case("sweep-axis-in-two-zips", "sweep {tmp}/s.toml", r"zip names 'client\.lr' in more than one group",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"client.lr" = [0.1, 0.2]\n"client.local_steps" = [1, 2]\n'
                      '"run.seed" = [0, 1]\nzip = [["client.lr", "client.local_steps"], ["client.lr", "run.seed"]]\n'}),
    case("sweep-empty-zip", "sweep {tmp}/s.toml", r"zip = \[\[\]\] has an empty group",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [0, 1]\nzip = [[]]\n'}),
    case("sweep-escaping-name", "sweep {tmp}/s.toml", r"\[run\] name = '\.\./escaped' is not a plain folder name",
         **{"s.toml": 'base = "quickstart"\n[run]\nname = "../escaped"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("sweep-damaged-study-toml", "sweep {tmp}/s.toml", r"study\.toml: damaged \(no base config and axes in it\); delete it",
         **{"s.toml": 'base = "quickstart"\n[run]\nname = "dmg"\nout = "{tmp}/runs"\n[sweep]\n"run.seed" = [0, 1]\n',
            "runs/dmg/study.toml": ""}),
    case("report-damaged-study-toml", "report {tmp}/runs/dmg", r"study\.toml: damaged \(invalid TOML",
         **{"runs/dmg/study.toml": "{"}),
    case("convert-over-its-input", "trace convert --from csv {tmp}/in.csv --out {tmp}/in.csv",
         r"--out \S+in\.csv: is the input \S+in\.csv; give another path", **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("convert-existing-out", "trace convert --from csv {tmp}/in.csv --out {tmp}/t.parquet",
         r"--out \S+t\.parquet: the file exists; give another path, or --force",
         **{"in.csv": "device_id,start,end\n0,0,10\n", "t.parquet": "keep me"}),
    case("report-damaged-events", "report {tmp}/run", r"events\.parquet: not the events log of a fedsim run",
         run=run_dir(lambda d: (d / "events.parquet").write_text("not parquet"))),
    case("report-damaged-manifest", "report {tmp}/run", r"manifest\.json: damaged \(not a JSON object\); `fedsim run --resume",
         run=run_dir(lambda d: (d / "manifest.json").write_text("[1]"))),
    case("batch-size-beyond-any-run", RUN, r"\[client\] batch_size = 1000000000 is more than any run needs \(at most 1,000,000\)",
         **{"c.toml": config(client={"batch_size": 10**9})}),
    case("local-steps-beyond-any-run", RUN, r"\[client\] local_steps = 1000000000 is more than any run needs \(at most 100,000\)",
         **{"c.toml": config(client={"local_steps": 10**9})}),
    case("model-beyond-memory", "run quickstart --set model.name=mlp --set model.hidden=1000000000 --quiet",
         r"^error: a local step of the run needs about 90\.\d TB of memory \(parameters, gradients and starts of 100 "
         r"devices x 75,000,000,010 parameters: 90 TB; .*\), more than 90% of the \S+ [GT]B of this machine; "
         r"lower \[model\] hidden or \[data\] clients$"),
    case("batch-beyond-memory", "run quickstart --set model.name=mlp --set model.hidden=10000000 --set "
         "client.batch_size=1000000 --set client.trainer=loop --set server.clients_per_round=1 --quiet",
         r"layer outputs of 1,000,000 samples in one call: 80 TB; .* lower \[client\] batch_size$"),
    case("users-on-a-dataset-without-users", RUN, r"\[data\] users does not apply to \[data\] dataset = 'quadratic' "
         r"\(only a dataset with its own clients reads it\); remove it", **{"c.toml": config(data={"users": "most-samples"})}),
    case("parquet-key-on-leaf", RUN, r"\[data\] client_column does not apply to \[data\] dataset = 'femnist' "
         r"\(only dataset = 'parquet' reads it\)", **{"c.toml": config(data={"dataset": "femnist", "client_column": "u"})}),
    case("dim-beyond-any-run", RUN, r"\[data\] dim = 1000000000 is more than any run needs \(at most 10,000,000\)",
         **{"c.toml": config(data={"dataset": "quadratic", "dim": 10**9})}),
    case("samples-beyond-any-run", RUN, r"\[data\] samples = 10000000000 is more than any run needs",
         **{"c.toml": config(data={"dataset": "logistic", "samples": 10**10})}),
    case("sweep-point-beyond-memory", "sweep {tmp}/s.toml --quiet",
         r"^error: point hidden-1000000000: a local step of the run needs about .* lower \[model\] hidden",
         **{"s.toml": '[run]\nrounds = 2\n[model]\nname = "mlp"\n[sweep]\n"model.hidden" = [1000000000]\n'}),
    case("trace-symlink-loop", "trace info {tmp}/loop.parquet", r"loop\.parquet is a symbolic link in a loop",
         **{"loop.parquet": lambda path, run: path.symlink_to(path.name)}),
    case("run-trace-symlink-loop", RUN, r"\[trace\] path: \S+loop\.parquet is a symbolic link in a loop",
         **{"loop.parquet": lambda path, run: path.symlink_to(path.name), "c.toml": config("{tmp}/loop.parquet")}),
    case("quadratic-with-a-model", RUN, r"\[model\] name = 'mlp' does not apply to the quadratic task",
         **{"c.toml": config(model={"name": "mlp"})}),
    case("plot-over-the-trace", "trace plot {tmp}/t.parquet --out {tmp}/t.parquet",
         r"--out \S+t\.parquet: is the input", **{"t.parquet": trace()}),
    case("sweep-unknown-axis", "sweep {tmp}/s.toml",
         r"^error: axis client\.lrr of \[sweep\] in \S+s\.toml: unknown key \[client\] lrr; did you mean 'lr'\?$",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"client.lrr" = [0.1, 0.2]\n'}),
    case("sweep-empty-axis", "sweep {tmp}/s.toml", r"\[sweep\] 'client\.lr' = \[\] must be a non-empty list",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"client.lr" = []\n'}),
    case("sweep-bad-value", "sweep {tmp}/s.toml", r"^error: axis client\.lr of \[sweep\] in \S+s\.toml: \[client\] lr = -1\.0 must be > 0$",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"client.lr" = [0.1, -1.0]\n'}),
    case("sweep-bad-key-in-base", "sweep {tmp}/s.toml", r"^error: base config \S+s\.toml: unknown key \[run\] bogus; did you mean 'rounds'\?$",
         **{"s.toml": 'base = "quickstart"\n[run]\nbogus = 3\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("sweep-bad-key-in-base-file", "sweep {tmp}/s.toml", r"^error: base config \S+b\.toml: unknown key \[client\] lrr",
         **{"b.toml": 'extends = "quickstart"\n[client]\nlrr = 3\n',
            "s.toml": 'base = "b.toml"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("sweep-bad-section-by-set", "sweep {tmp}/s.toml --set foo.bar=1", r"^error: --set foo\.bar=1: unknown section \[foo\]",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("sweep-bad-value-by-set", "sweep {tmp}/s.toml --set client.lr=-1", r"^error: --set client\.lr=-1: \[client\] lr = -1\.0 must be > 0",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("sweep-bad-axis-by-set", "sweep {tmp}/s.toml --set sweep.client.lr=[-1]",
         r"^error: --set sweep\.client\.lr=\[-1\]: \[client\] lr = -1\.0 must be > 0",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("sweep-bad-warm-start", "sweep {tmp}/s.toml", r"^error: \[warm_start\] client\.lr in \S+s\.toml: \[client\] lr = -3\.0 must be > 0",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [0, 1]\n[warm_start]\n"client.lr" = -3\n'}),
    case("sweep-invalid-point", "sweep {tmp}/s.toml",
         r"^error: \S+s\.toml: point algorithm-fedavg-wait_mode-async \(algorithm\.name = 'fedavg-wait', "
         r"server\.mode = 'async'\): \[algorithm\] 'fedavg-wait' cannot run with \[server\] mode = 'async'",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"algorithm.name" = ["fedavg", "fedavg-wait"]\n'
                      '"server.mode" = ["sync", "async"]\n'}),
    case("sweep-every-point-invalid", "sweep {tmp}/s.toml --set server.timing=ideal --set server.mode=async",
         r"^error: --set server\.mode=async: \[server\] mode = 'async' needs timing = 'model' .*\(every point\)$",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("extends-1200-files-deep", RUN, r"c\.toml: extends goes deeper than 64 files \(c\.toml -> e0\.toml -> \.\.\. -> "
         r"e62\.toml -> e63\.toml -> \.\.\.\); fedsim follows at most 64: merge some of the files into one",
         **{"c.toml": extends_chain}),
    case("claim-accuracy-on-quadratic", "sweep {tmp}/s.toml", r"s\.toml: claim 1 \('mifa beats fedavg'\): metric "
         r"'final_acc' \(test accuracy at the last evaluation\) does not exist for the quadratic task, which has no "
         r"classes and so no accuracy; use one it has: final_loss, tail_loss, loss_swing, round_s, sim_time$",
         **{"s.toml": quadratic_study(ACCURACY_CLAIM)}),
    case("report-accuracy-claim-on-quadratic", "report {tmp}/runs/t --claims", r"runs/t/study\.toml: claim 1 \('mifa "
         r"beats fedavg'\): metric 'final_acc' \(test accuracy at the last evaluation\) does not exist for the "
         r"quadratic task", runs=swept_then_claimed),
    case("config-show-bad-key", "config show quickstart --set run.roundz=3", r"did you mean 'rounds'"),
    # --- traces ------------------------------------------------------------------------------
    case("trace-unsorted", "trace info {tmp}/t.parquet", r"row 2 \(device 1\): rows are not sorted",
         **{"t.parquet": trace(device_id=[0, 2, 1], start=[0.0, 5.0, 10.0], end=[50.0, 100.0, 90.0])}),
    case("trace-overlap", "trace info {tmp}/t.parquet", r"row 1 \(device 0\): start 10\.0 < end 50\.0 of the previous",
         **{"t.parquet": trace(device_id=[0, 0, 2])}),
    case("trace-negative-start", "trace info {tmp}/t.parquet", r"row 0 \(device 0\): start -1\.0 < 0",
         **{"t.parquet": trace(start=[-1.0, 10.0, 5.0])}),
    case("trace-end-before-start", "trace info {tmp}/t.parquet", r"row 1 \(device 1\): end 5\.0 <= start 10\.0",
         **{"t.parquet": trace(end=[50.0, 5.0, 100.0])}),
    case("trace-beyond-horizon", "trace info {tmp}/t.parquet", r"end 200\.0 > horizon 100\.0",
         **{"t.parquet": trace(end=[50.0, 90.0, 200.0])}),
    case("trace-id-outside", "trace info {tmp}/t.parquet", r"device_id 7 is outside 0\.\.2",
         **{"t.parquet": trace(device_id=[0, 1, 7])}),
    case("trace-id-2-64", "trace info {tmp}/t.parquet", r"row 2: device_id 18446744073709551615 is too large",
         **{"t.parquet": trace(device_id=pa.array(np.array([0, 1, 2**64 - 1], dtype=np.uint64)))}),
    case("trace-missing-column", "trace info {tmp}/t.parquet", r"missing column 'end'",
         **{"t.parquet": trace(columns={"device_id": [0], "start": [0.0]})}),
    case("trace-string-times", "trace info {tmp}/t.parquet", r"column 'start' has type string",
         **{"t.parquet": trace(start=["0", "10", "5"])}),
    case("trace-null", "trace info {tmp}/t.parquet", r"row 1: end is null", **{"t.parquet": trace(end=[50.0, None, 100.0])}),
    case("trace-no-metadata", "trace info {tmp}/t.parquet", r"no 'fedsim\.trace\.version' metadata",
         **{"t.parquet": trace(meta={})}),
    case("trace-wrong-version", "trace info {tmp}/t.parquet", r"trace version '7' is not supported",
         **{"t.parquet": trace(meta={**META, "fedsim.trace.version": "7"})}),
    case("trace-bad-n-devices", "trace info {tmp}/t.parquet", r"n_devices = 'three' is not an integer",
         **{"t.parquet": trace(meta={**META, "n_devices": "three"})}),
    case("trace-negative-horizon", "trace info {tmp}/t.parquet", r"horizon = -5\.0; it must be a finite number of seconds > 0",
         **{"t.parquet": trace(meta={**META, "horizon": "-5"})}),
    case("trace-not-parquet", "trace info {tmp}/t.parquet", r"t\.parquet: not a readable Parquet file",
         **{"t.parquet": "device_id,start,end\n0,0,1\n"}),
    case("trace-missing", "trace info {tmp}/nope.parquet", r"nope\.parquet: file not found"),
    case("trace-a-folder", "trace info {tmp}", r"is a directory; give the path of a \.parquet file"),
    case("trace-device-table-twice", RUN, r"device table .*d\.parquet: row 1: device_id 0 appears twice",
         **{"t.parquet": trace(), "d.parquet": trace(columns={"device_id": [0, 0, 1]}, meta={}),
            "c.toml": config("{tmp}/t.parquet", trace={"source": "file", "path": "{tmp}/t.parquet",
                                                       "devices_table": "{tmp}/d.parquet"},
                             devices={"model": "table"})}),
    case("devices-table-tz-out-of-range", RUN,
         r"device table .*d\.parquet: tz_offset = 15\.0 on row 1 \(device 1\); it must be hours within \[-14, 14\]",
         **{"t.parquet": trace(), "d.parquet": trace(columns={"device_id": [0, 1, 2], "tz_offset": [1.0, 15.0, 0.0]},
                                                      meta={}),
            "c.toml": config("{tmp}/t.parquet", trace={"source": "file", "path": "{tmp}/t.parquet",
                                                       "devices_table": "{tmp}/d.parquet"})}),
    case("devices-table-run-column", RUN, r"column 'arrivals' is one that a run writes into devices\.parquet itself",
         **{"t.parquet": trace(), "d.parquet": trace(columns={"device_id": [0, 1, 2], "arrivals": [1, 2, 3]}, meta={}),
            "c.toml": config("{tmp}/t.parquet", trace={"source": "file", "path": "{tmp}/t.parquet",
                                                       "devices_table": "{tmp}/d.parquet"})}),
    case("devices-table-unknown-class", RUN, r"class 'watch' of device 2 is not a built-in class",
         **{"t.parquet": trace(), "d.parquet": trace(columns={"device_id": [0, 1, 2],
                                                              "class": ["phone-low", "phone-mid", "watch"]}, meta={}),
            "c.toml": config("{tmp}/t.parquet", trace={"source": "file", "path": "{tmp}/t.parquet",
                                                       "devices_table": "{tmp}/d.parquet"})}),
    case("devices-table-flops-and-seconds", RUN, r"gives both flops and seconds_per_sample",
         **{"t.parquet": trace(), "d.parquet": trace(columns={"device_id": [0, 1, 2], "flops": [1e9] * 3,
                                                              "seconds_per_sample": [0.1] * 3}, meta={}),
            "c.toml": config("{tmp}/t.parquet", trace={"source": "file", "path": "{tmp}/t.parquet",
                                                       "devices_table": "{tmp}/d.parquet"})}),
    case("devices-key-of-another-model", RUN, r"\[devices\] seconds_per_sample applies to model = 'constant', "
         r"'lognormal' or 'halfnormal', not 'profiles'", **{"c.toml": config(devices={"seconds_per_sample": 0.1})}),
    case("devices-unknown-class", RUN, r"\[devices\] classes = 'laptop' is not a device class",
         **{"c.toml": config(devices={"classes": ["laptop"]})}),
    case("devices-weights-per-class", RUN, r"class_weights has 3 shares for 4 classes",
         **{"c.toml": config(devices={"class_weights": [1, 1, 1]})}),
    case("convert-repeat-for-csv", CONVERT + " --repeat span", r"--repeat = 'span' is not valid for this format",
         **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("trace-plot-devices-too-short", "trace plot {tmp}/t.parquet --out {tmp}/p.png --devices {tmp}/d.parquet",
         r"has 2 rows for the trace's 3 devices",
         **{"t.parquet": trace(), "d.parquet": trace(columns={"device_id": [0, 1], "group": [1, 2]}, meta={})}),
    case("trace-wrong-device-count", RUN, r"3 devices.*clients = 5",
         **{"t.parquet": trace(), "c.toml": config("{tmp}/t.parquet", data={"clients": 5, "targets": []})}),
    case("trace-replaced-on-resume", "run --resume {tmp}/runs/t --quiet", r"t\.parquet: the trace file changed since",
         **{"t.parquet": trace(), "c.toml": config("{tmp}/t.parquet"), "runs": run_then_replace_trace}),
    case("trace-plot-out-folder", "trace plot {tmp}/t.parquet --out {tmp}", r"^error: --out \S+: is a folder; give the path of a file", **{"t.parquet": trace()}),
    case("generate-unknown-kind", "trace generate sometimes --devices 3 --days 1 --out {tmp}/g.parquet", r"trace generator = 'sometimes' is unknown \(one of: always, bernoulli"),
    case("generate-no-days", "trace generate always --devices 3 --days 0 --out {tmp}/g.parquet", r"--days 0\.0: give a number of days > 0"),
    case("generate-bad-set", "trace generate bernoulli --devices 3 --days 1 --set p --out {tmp}/g.parquet",
         r"--set 'p': expected key=value"),
    case("generate-over-a-file", "trace generate always --devices 3 --days 1 --out {tmp}/g.parquet",
         r"--out .*g\.parquet: the file exists; give another path, or --force", **{"g.parquet": b"precious"}),
    # --- converters --------------------------------------------------------------------------
    case("convert-a-folder", "trace convert --from csv {tmp} --out {tmp}/out.parquet", r"is a folder; give the file to convert"),
    case("convert-missing-input", CONVERT, r"csv trace \S+/in\.csv: file not found"),
    case("convert-unknown-format", "trace convert --from xls {tmp}/in.csv --out {tmp}/out.parquet", r"--from \(trace format\) = 'xls' is unknown",
         **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("csv-missing-column", CONVERT + " --end-col stop", r"the header has no column 'stop'",
         **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("csv-bad-time", CONVERT, r"line 3: start 'abc' is not a time", **{"in.csv": "device_id,start,end\n0,0,10\n1,abc,20\n"}),
    case("csv-end-before-start", CONVERT, r"line 2: interval \[10, 5\) needs finite 0 <= start < end",
         **{"in.csv": "device_id,start,end\n0,10,5\n"}),
    case("csv-empty", CONVERT, r"the file is empty", **{"in.csv": ""}),
    case("csv-not-utf8", CONVERT, r"not a UTF-8 text file", **{"in.csv": b"device_id,start,end\n\xff,0,1\n"}),
    case("csv-ragged", CONVERT, r"line 3: 4 fields where line 1 has 3", **{"in.csv": "device_id,start,end\n0,0,10\n1,0,10,7\n"}),
    case("csv-bad-time-unit", CONVERT + " --time-unit hours", r"--time-unit = 'hours' is unknown",
         **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("csv-bad-tz", CONVERT + " --tz Mars", r"--tz 'Mars' is not a UTC offset", **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("csv-too-many-devices", CONVERT, r"n_devices = 100,000,000,000 is above fedsim's limit",
         **{"in.csv": "device_id,start,end\n0,0,10\n99999999999,0,10\n"}),
    case("csv-tz-beyond-14-hours", CONVERT + " --tz +14:30", r"--tz '\+14:30' is beyond -14:00\.\.\+14:00, the range "
         r"of UTC offsets; give the offset of the times' zone", **{"in.csv": ISO_CSV}),
    case("csv-tz-beyond-minus-14-hours", CONVERT + " --tz=-14:59", r"--tz '-14:59' is beyond -14:00\.\.\+14:00",
         **{"in.csv": ISO_CSV}),
    case("csv-iso-offset-beyond-14-hours", CONVERT, r"line 3: end '2024-01-01T02:00:00\+14:45' has the UTC offset "
         r"\+14:45, beyond -14:00\.\.\+14:00; give the offset of the times' zone",
         **{"in.csv": ISO_CSV.replace("02:00:00\n", "02:00:00+14:45\n")}),
    case("csv-iso-offset-beyond-minus-14-hours", CONVERT, r"line 2: start '2024-01-01T00:00:00-14:59' has the UTC "
         r"offset -14:59, beyond", **{"in.csv": ISO_CSV.replace("00:00:00,", "00:00:00-14:59,")}),
    case("csv-column-that-a-run-writes", CONVERT, r"device table \S+out\.devices\.parquet: column 'arrivals' is one that "
         r"a run writes into devices\.parquet itself; rename it",
         **{"in.csv": "device_id,start,end,arrivals\n0,0,10,1\n1,0,20,2\n"}),
    case("fedscale-not-pickle", "trace convert --from fedscale {tmp}/in.pkl --out {tmp}/out.parquet",
         r"not a FedScale client_behave_trace pickle", **{"in.pkl": b"not a pickle"}),
    case("flash-not-json", "trace convert --from flash {tmp}/in.json --out {tmp}/out.parquet",
         r"not FLASH user-behaviour JSON", **{"in.json": "{oops"}),
    # --- datasets ----------------------------------------------------------------------------
    case("mnist-missing-files", RUN, r"\[data\] dataset = 'mnist': files not found in .*data.*set \[data\] root",
         **{"c.toml": config(data={"dataset": "mnist", "root": "{tmp}/data", "targets": []}),
            "data": lambda path, run: path.mkdir()}),
    case("fashion-mnist-damaged", RUN, r"\[data\] dataset = 'fashion-mnist': .* is damaged",
         **{"c.toml": config(data={"dataset": "fashion-mnist", "root": "{tmp}/data", "targets": []}),
            "data": lambda path, run: idx_files(path)}),
    case("cifar10-missing-files", RUN, r"\[data\] dataset = 'cifar10': files not found",
         **{"c.toml": config(data={"dataset": "cifar10", "root": "{tmp}/data", "targets": []})}),
    case("svhn-missing-files", RUN, r"\[data\] dataset = 'svhn': files not found",
         **{"c.toml": config(data={"dataset": "svhn", "root": "{tmp}/data", "targets": []})}),
    case("leaf-train-without-users", RUN, r"train/all_data_0_train\.json: no users \(`\"users\": \[\]`\), so no training "
         r"samples; regenerate the dataset with LEAF's preprocess\.sh",
         **{"c.toml": LEAF, "leaf": leaf(lambda train, test: no_users(train))}),
    case("leaf-test-without-users", RUN, r"test/all_data_0_test\.json: no users .*, so no test samples; regenerate",
         **{"c.toml": LEAF, "leaf": leaf(lambda train, test: no_users(test))}),
    case("leaf-user-id-a-list", RUN, r"all_data_0_train\.json: user 1 of `users` is \['u1'\], not a string \(the key "
         r"of its samples in `user_data`\); regenerate it", **{"c.toml": LEAF, "leaf": leaf(
             lambda train, test: train["users"].__setitem__(1, ["u1"]))}),
    case("leaf-nan-pixel", RUN, r"all_data_0_train\.json, user 'u1': sample 1 has a pixel nan, not a finite number; "
         r"fix or drop the sample", **{"c.toml": LEAF, "leaf": leaf(
             lambda train, test: train["user_data"]["u1"]["x"][1].__setitem__(5, float("nan")))}),
    case("parquet-empty-train", RUN, r"pq/train\.parquet: no rows, so no training samples; give the dataset "
         r"training rows", **{"c.toml": PARQUET, "pq": parquet_data(
             {"user": pa.array([], pa.string()), "label": pa.array([], pa.int64()),
              "x": pa.array([], pa.list_(pa.float64()))})}),
    case("parquet-image-bomb", RUN, r"pq/train\.parquet, row 2: the image is larger than fedsim reads \(20000 x 20000 "
         r"pixels; at most 4096 x 4096\); resize the images", **{"c.toml": PARQUET, "pq": parquet_data(
             samples([png(), png(), png_header(20000, 20000), png()]))}),
    case("parquet-label-2-64", RUN, r"pq/train\.parquet, row 3: label 18446744073709551615 is beyond the 1,000,000 "
         r"classes fedsim trains; number the classes 0, 1, \.\.\.", **{"c.toml": PARQUET, "pq": parquet_data(
             samples([[1.0]] * 4, label=pa.array([0, 1, 0, 2**64 - 1], pa.uint64())))}),
    case("parquet-client-types-differ", RUN, r"pq/train\.parquet: column 'user' is of type int64 where \S+test\.parquet "
         r"has string; give the column one type in every file", **{"c.toml": PARQUET, "pq": parquet_data(
             samples([[1.0]] * 4, user=[1, 1, 2, 2]), samples([[1.0]] * 4))}),
    case("parquet-empty-features", RUN, r"pq/train\.parquet, row 0: the feature is an empty list; every sample needs at "
         r"least one number", **{"c.toml": PARQUET, "pq": parquet_data(samples(pa.array([[]] * 4, pa.list_(pa.float64()))))}),
    case("parquet-nested-lists", RUN, r"pq/train\.parquet: column 'x' is of type list<\w+: list<\w+: double>>; a "
         r"feature must be an image, a list of numbers \(one list per row, not lists of lists\)", **{"c.toml": PARQUET, "pq": parquet_data(
             samples([[[1.0, 2.0]]] * 4))}),
    case("parquet-nan-feature", RUN, r"pq/train\.parquet, row 1: the feature holds nan, not a finite number; fix or "
         r"drop the row", **{"c.toml": PARQUET, "pq": parquet_data(samples([[1.0, 2.0], [3.0, float("nan")]] * 2))}),
    case("parquet-one-column-two-roles", RUN, r"\[data\] label_column = 'user' is also the client_column: a column has "
         r"one role", **{"c.toml": PARQUET.replace('label_column = "label"', 'label_column = "user"'),
                         "pq": parquet_data(samples([[1.0]] * 4))}),
    case("parquet-one-hot-labels", RUN, r"pq/train\.parquet: column 'label' holds list<\w+: int64> values, not one class "
         r"a row; store each row's class as one integer or string \(the class number of a one-hot vector: its argmax\)",
         **{"c.toml": PARQUET, "pq": parquet_data(samples([[1.0]] * 4, label=[[1, 0], [0, 1], [1, 0], [0, 1]]))}),
    case("parquet-client-records", RUN, r"pq/train\.parquet: column 'user' holds struct<a: int64> values, not one client "
         r"id a row; store each row's client id as one string or number", **{"c.toml": PARQUET, "pq": parquet_data(
             samples([[1.0]] * 4, user=[{"a": 1}, {"a": 1}, {"a": 2}, {"a": 2}]))}),
    case("parquet-no-test-rows-pooled", RUN, r"no test samples: without test files fedsim holds out \[data\] "
         r"test_fraction = 0\.25 of each client's rows, and a client keeps at least one for training, so clients of "
         r"one row hold none out; give the dataset test files, or leave \[data\] client_column unset",
         **{"c.toml": PARQUET.replace('clients = 2', 'clients = 2\npartition = "iid"'),
            "pq": parquet_data(samples([[1.0]] * 4, user=["a", "b", "c", "d"]))}),
    case("parquet-no-test-rows-every-user", RUN, r"pq: no test samples: without test files fedsim holds out \[data\] "
         r"test_fraction = 0\.25 of each client's rows, and a client keeps at least one for training, so clients of "
         r"one row hold none out; give the dataset test files$", **{"c.toml": PARQUET.replace('clients = 2', 'clients = 4'),
                                                                  "pq": parquet_data(samples([[1.0]] * 4, user=["a", "b", "c", "d"]))}),
    case("parquet-test-rows-of-another-shape", RUN, r"pq: the test rows' features have shape \(3,\) where the training "
         r"rows' have \(2,\); give every row one shape \(images of one size and colour mode, lists of one length\)",
         **{"c.toml": PARQUET, "pq": parquet_data(samples([[1.0, 2.0]] * 4), samples([[1.0, 2.0, 3.0]] * 4))}),
    case("parquet-one-class", RUN, r"label_column = 'label': every training row \(in \S+pq\) has one class, so any "
         r"model scores 100 %; name the column that holds the labels", **{"c.toml": PARQUET, "pq": parquet_data(
             samples([[1.0]] * 4, label=[0, 0, 0, 0]))}),
    case("parquet-16-bit-images", RUN, r"pq/train\.parquet, row 0: a 16-bit image \(mode I;16\); fedsim reads images "
         r"of 8 bits a channel, as bytes / 255: save them as 8-bit images", **{"c.toml": PARQUET, "pq": parquet_data(
             samples([png("I;16")] * 4))}),
    case("parquet-images-of-two-modes", RUN, r"pq/train\.parquet, row 2: RGB image where the first is L; give every "
         r"image one colour mode", **{"c.toml": PARQUET, "pq": parquet_data(samples([png(), png(), png("RGB"), png()]))}),
    case("parquet-image-paths-without-bytes", RUN, r"pq/train\.parquet, row 0: the image has no bytes \(only a path, "
         r"'a\.png', which fedsim does not read\); store each image's PNG or JPEG bytes in the column",
         **{"c.toml": PARQUET, "pq": parquet_data(samples([{"bytes": None, "path": "a.png"}] * 4))}),
    case("parquet-labels-numbered-sparsely", RUN, r"label_column = 'label': the training rows use 3 class numbers of "
         r"0\.\.30 \(in \S+pq\), so the model would have 31 outputs, 28 of them for classes no sample has",
         **{"c.toml": PARQUET, "pq": parquet_data(samples([[1.0]] * 4, label=[10, 20, 30, 10]))}),
    # --- outputs -----------------------------------------------------------------------------
    case("run-out-under-a-file", RUN, r"cannot create the folder (\S+)/blocker/runs: \1/blocker is a file; choose another \[run\] out", blocker="",
         **{"c.toml": config(run={"out": "{tmp}/blocker/runs"})}),
    case("generate-out-a-folder", "trace generate always --devices 3 --days 1 --out {tmp}", r"^error: --out \S+: is a folder; give the path"),
    case("generate-out-under-a-file", "trace generate always --devices 3 --days 1 --out {tmp}/blocker/t.parquet",
         r"cannot create the folder (\S+)/blocker: \1/blocker is a file", blocker=""),
    case("devices-out-a-folder", CONVERT + " --devices-out {tmp}", r"^error: --devices-out \S+: is a folder; give the path", **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("plot-into-a-file", "plot {tmp}/r", r"cannot create the folder (\S+)/r/plots: \1/r/plots is a file", r=run_dir(lambda path: (path / "plots").write_text(""))),
    # --- run directories, checkpoints, files a command must not overwrite, your own module (issue 37) ---
    case("resume-newer-manifest", "run --resume {tmp}/r --quiet", r"r/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail \(pip install -U "
         r"fedsim-avail\) to read or resume the run \(this one leaves it untouched\)$", r=run_dir(manifest_says(run_format=99))),
    case("resume-newer-checkpoint", "run --resume {tmp}/r --set run.rounds=4 --quiet", r"r/checkpoint\.pt: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail",
         r=run_dir(checkpoint_says(run_format=99))),
    case("resume-format-a-string", "run --resume {tmp}/r --quiet", r"r/manifest\.json: run_format = '1' is not a run "
         r"format \(an integer from 0\); the file was edited or damaged: give it back the format the run was written "
         r"in \(2 for this release\), or start the run again$", r=run_dir(manifest_says(run_format="1"))),
    case("resume-format-a-bool", "run --resume {tmp}/r --quiet", r"manifest\.json: run_format = True is not a run format",
         r=run_dir(manifest_says(run_format=True))),
    case("resume-format-a-float", "run --resume {tmp}/r --quiet", r"manifest\.json: run_format = 1\.0 is not a run format",
         r=run_dir(manifest_says(run_format=1.0))),
    case("resume-format-a-list", "run --resume {tmp}/r --quiet", r"manifest\.json: run_format = \[1\] is not a run format",
         r=run_dir(manifest_says(run_format=[1]))),
    case("resume-format-null", "run --resume {tmp}/r --quiet", r"manifest\.json: run_format = None is not a run format",
         r=run_dir(manifest_says(run_format=None))),
    case("resume-format-negative", "run --resume {tmp}/r --quiet", r"manifest\.json: run_format = -1 is not a run format",
         r=run_dir(manifest_says(run_format=-1))),
    case("resume-checkpoint-format-a-string", "run --resume {tmp}/r --quiet",
         r"r/checkpoint\.pt: run_format = '1' is not a run format", r=run_dir(checkpoint_says(run_format="1"))),
    case("resume-checkpoint-format-a-dict", "run --resume {tmp}/r --quiet",
         r"r/checkpoint\.pt: run_format = \{'v': 1\} is not a run format", r=run_dir(checkpoint_says(run_format={"v": 1}))),
    case("report-newer", "report {tmp}/r", r"r/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail", r=run_dir(manifest_says(run_format=99))),
    case("report-json-newer", "report {tmp}/r --json", r"r/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail", r=run_dir(manifest_says(run_format=99))),
    case("report-format-a-string", "report {tmp}/r", r"r/manifest\.json: run_format = '2' is not a run format",
         r=run_dir(manifest_says(run_format="2"))),
    case("plot-newer", "plot {tmp}/r", r"r/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail", r=run_dir(manifest_says(run_format=99))),
    case("trace-info-newer", "trace info {tmp}/r", r"r/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail", r=run_dir(manifest_says(run_format=99))),
    case("trace-plot-newer", "trace plot {tmp}/r --out {tmp}/p.png", r"r/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail",
         r=run_dir(manifest_says(run_format=99))),
    case("trace-info-format-a-list", "trace info {tmp}/r --json", r"r/manifest\.json: run_format = \[\] is not a run format",
         r=run_dir(manifest_says(run_format=[]))),
    case("init-from-newer", RUN, r"r/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail", r=run_dir(manifest_says(run_format=99)),
         **{"c.toml": config(model={"init_from": "{tmp}/r"})}),
    case("init-from-model-pt-of-newer", RUN, r"r/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail", r=run_dir(manifest_says(run_format=99)),
         **{"c.toml": config(model={"init_from": "{tmp}/r/model.pt"})}),
    case("resume-comparison-member-newer", "run --resume {tmp}/runs/t --set run.rounds=3 --quiet",
         r"runs/t/mifa/checkpoint\.pt: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail", runs=compared(lambda d: checkpoint_says(run_format=99)(d / "mifa"))),
    case("resume-comparison-member-manifest-a-string", "run --resume {tmp}/runs/t --quiet",
         r"runs/t/fedavg/manifest\.json: run_format = '1' is not a run format",
         runs=compared(lambda d: manifest_says(run_format="1")(d / "fedavg"))),
    case("report-comparison-member-newer", "report {tmp}/runs/t", r"runs/t/mifa/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail",
         runs=compared(lambda d: manifest_says(run_format=99)(d / "mifa"))),
    case("plot-comparison-member-newer", "plot {tmp}/runs/t", r"runs/t/mifa/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail",
         runs=compared(lambda d: manifest_says(run_format=99)(d / "mifa"))),
    case("sweep-resume-point-newer", "sweep --resume {tmp}/runs/t --set run.rounds=3 --quiet",
         r"runs/t/algorithm-mifa_seed-1/checkpoint\.pt: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail",
         runs=swept(lambda d: checkpoint_says(run_format=99)(d / "algorithm-mifa_seed-1"))),
    case("sweep-again-point-newer", "sweep {tmp}/s.toml --quiet", r"runs/t/algorithm-fedavg_seed-0/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail",
         runs=swept(lambda d: manifest_says(run_format=99)(d / "algorithm-fedavg_seed-0"))),
    case("report-study-point-newer", "report {tmp}/runs/t", r"runs/t/algorithm-fedavg_seed-1/manifest\.json: run format 99 is newer than this release reads \(at most 2\); a later release of fedsim wrote it: upgrade fedsim-avail",
         runs=swept(lambda d: manifest_says(run_format=99)(d / "algorithm-fedavg_seed-1"))),
    case("plot-study-point-format-a-float", "plot {tmp}/runs/t", r"manifest\.json: run_format = 1\.5 is not a run format",
         runs=swept(lambda d: manifest_says(run_format=1.5)(d / "algorithm-fedavg_seed-1"))),
    case("trace-plot-over-the-manifest", "trace plot {tmp}/r --out {tmp}/r/manifest.json --force",
         r"--out \S+/r/manifest\.json: is a file of the run directory \S+/r, which no other command writes over \(not "
         r"even with --force\); give a path outside it, or a new file name$", r=run_dir()),
    case("trace-plot-over-the-checkpoint", "trace plot {tmp}/t.parquet --out {tmp}/r/checkpoint.pt",
         r"--out \S+/r/checkpoint\.pt: is a file of the run directory", r=run_dir(), **{"t.parquet": trace()}),
    case("trace-plot-over-a-run-plot", "trace plot {tmp}/r --out {tmp}/r/plots/test_acc.png --force",
         r"--out \S+/r/plots/test_acc\.png: is a file of the run directory \S+/r,",
         r=run_dir(lambda d: ((d / "plots").mkdir(), (d / "plots" / "test_acc.png").write_bytes(png())))),
    case("trace-plot-over-a-users-file-in-a-run", "trace plot {tmp}/r --out {tmp}/r/notes.png --force",
         r"--out \S+/r/notes\.png: is a file of the run directory", r=run_dir(lambda d: (d / "notes.png").write_bytes(png()))),
    case("trace-plot-redraw-needs-force", "trace plot {tmp}/r --out {tmp}/r/trace.png",
         r"--out \S+/r/trace\.png: the file exists; give another path, or --force to overwrite it$", r=trace_picture),
    case("trace-plot-over-a-study-file", "trace plot {tmp}/t.parquet --out {tmp}/st/study.toml --force",
         r"--out \S+/st/study\.toml: is a file of the run directory \S+/st,", **{"t.parquet": trace(), "st/study.toml": "x", "st/summary.parquet": "x"}),
    case("trace-plot-over-a-comparison-summary", "trace plot {tmp}/t.parquet --out {tmp}/runs/t/summary.parquet --force",
         r"--out \S+/runs/t/summary\.parquet: is a file of the run directory \S+/runs/t,", runs=compared(),
         **{"t.parquet": trace()}),
    case("generate-over-the-rounds", "trace generate always --devices 3 --days 1 --out {tmp}/r/rounds.parquet --force",
         r"--out \S+/r/rounds\.parquet: is a file of the run directory", r=run_dir()),
    case("generate-devices-out-over-the-devices", "trace generate always --devices 3 --days 1 --out {tmp}/g.parquet "
         "--devices-out {tmp}/r/devices.parquet --force", r"--devices-out \S+/r/devices\.parquet: is a file of the run "
         r"directory", r=run_dir()),
    case("convert-over-the-events", CONVERT.replace("{tmp}/out.parquet", "{tmp}/r/events.parquet") + " --force",
         r"--out \S+/r/events\.parquet: is a file of the run directory", r=run_dir(),
         **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("convert-devices-out-over-the-config", CONVERT + " --devices-out {tmp}/r/config.toml --force",
         r"--devices-out \S+/r/config\.toml: is a file of the run directory", r=run_dir(),
         **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("convert-beside-table-over-a-run-file", "trace convert --from csv {tmp}/in.csv --out {tmp}/r/model.parquet --force",
         r"--out's device table \S+/r/model\.devices\.parquet: is a file of the run directory",
         r=run_dir(lambda d: (d / "model.devices.parquet").write_bytes(b"kept")),
         **{"in.csv": "device_id,start,end,tz\n0,0,10,+01:00\n"}),
    case("factory-calls-sys-exit", RUN, r"^error: \[model\] name = 'exiting:make': the factory called sys\.exit\(3\) "
         r"while building the model; raise an exception that says what is wrong instead",
         **{"c.toml": DIGITS + '[model]\nname = "exiting:make"\n', "exiting.py": module_file(
             "def make(in_shape, n_classes, cfg):\n    sys.exit(3)\n")}),
    case("module-exits-on-import", RUN, r"^error: \[model\] name: 'exiting_at_import:make': importing "
         r"'exiting_at_import' called sys\.exit\(4\); a module fedsim imports must not exit",
         **{"c.toml": DIGITS + '[model]\nname = "exiting_at_import:make"\n', "exiting_at_import.py": module_file("sys.exit(4)\n")}),
    case("forward-inverts-a-float-mask", RUN, r"'inverting:make': the module's own forward raised TypeError \(~ "
         r"\(operator\.invert\) is only implemented on integer and Boolean-type tensors\) on a batch of 2 of the dataset's "
         r"inputs; fix the forward \(hint: its input is \[batch, 1, 8, 8\]\)$",
         **{"c.toml": DIGITS + '[model]\nname = "inverting:make"\n', "inverting.py": module_file(
             "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.register_buffer('mask', torch.zeros(64))\n        self.fc = nn.Linear(64, 10)\n\n"
             "    def forward(self, x):\n        return self.fc(x.flatten(1) * ~self.mask)\n\n\n"
             "def make(in_shape, n_classes, cfg):\n    return Net()\n")}),
    case("forward-exits", RUN, r"'quitting:make': the module's own forward raised SystemExit \(5\)",
         **{"c.toml": DIGITS + '[model]\nname = "quitting:make"\n', "quitting.py": module_file(
             "class Net(nn.Linear):\n    def forward(self, x):\n        sys.exit(5)\n\n\n"
             "def make(in_shape, n_classes, cfg):\n    return Net(64, 10)\n")}),
    case("run-a-study-points-config", "run {tmp}/runs/t/algorithm-fedavg_seed-0/config.toml --quiet",
         r"^error: \S+/runs/t/algorithm-fedavg_seed-0/config\.toml: \[run\] out = '\S+/runs/t' is in the folder of the "
         r"study \S+/runs/t, which only its sweep writes to; run it as a new run beside the study with `fedsim run "
         r"\S+/config\.toml --set run\.out=\S+/runs`, or finish the study with `fedsim sweep --resume \S+/runs/t`$",
         runs=swept()),
    case("run-a-study-points-config-by-set", RUN + " --set run.out={tmp}/runs/t/more", r"\[run\] out = '\S+/runs/t/more' is "
         r"in the folder of the study \S+/runs/t,", runs=swept(), **{"c.toml": config()}),
    #
    # --- asynchronous runs: stop and resume (issue 37) ---
    case("async-resume-of-a-past-release", "run --resume {tmp}/a --set run.rounds=8", r"a/checkpoint\.pt: cannot "
         r"resume a run with \[server\] mode = 'async' of an earlier release \(it did not checkpoint the tasks in "
         r"flight and the buffered updates\); start the run again from its config\.toml, with \[run\] rounds set",
         a=lambda path, run: shutil.copytree(Path(__file__).parent / "past_runs" / "d478d11" / "async", path)),
    case("async-resume-of-a-checkpoint-without-its-tasks", "run --resume {tmp}/runs/t", r"runs/t/checkpoint\.pt: "
         r"cannot resume a run with \[server\] mode = 'async' of an earlier release",
         **{"c.toml": config(server={"timing": "model", "mode": "async", "concurrency": 3, "buffer": 2}),
            "runs": lambda path, run: async_run_as_before(path)}),
    #
    #
    #
    # --- unbounded work, memory, config refusals before loading (issue 37) ---
    case("local-epochs-beyond-any-task", RUN, r"^error: \S+c\.toml: \[client\] local_epochs = 1e\+09 means at least "
         r"1,000,000,000 local steps a task \(an epoch is at least one minibatch\), more than the 100,000 a task may take",
         **{"c.toml": config(client={"local_epochs": 1e9})}),
    case("local-epochs-beyond-any-task-ideal", "run quickstart --set client.local_epochs=1e9 --set server.timing=ideal --quiet",
         r"^error: --set client\.local_epochs=1e9: \[client\] local_epochs = 1e\+09 means at least 1,000,000,000 local steps"),
    case("local-epochs-largest-device", "run quickstart --set client.local_epochs=200 --set data.clients=2 --set "
         "data.partition=iid --set client.batch_size=1 --set run.algorithms=[] --quiet",
         r"^error: \[client\] local_epochs = 200 means 134,800 local steps a task for the largest device \(1: 674 samples, "
         r"674 minibatches of batch_size = 1 an epoch\), more than the 100,000 a task may take; give local_epochs <= 148 "
         r"or a larger batch_size$"),
    case("local-epochs-largest-device-run-steps", "run quickstart --set client.local_epochs=20 --set data.clients=2 --set "
         "data.partition=iid --set client.batch_size=1 --set run.algorithms=[] --set run.rounds=100000000 --quiet",
         r"^error: \S+quickstart\.toml: the run asks for up to 2,696,000,000,000 local steps \(\[run\] rounds = 100,000,000 x "
         r"\[data\] clients = 2 \(every online device\) x 13,480 steps a task by \[client\] local_epochs\), more than any "
         r"run finishes \(at most 1,000,000,000,000\); lower \[run\] rounds, \[data\] clients or \[client\] local_epochs$"),
    case("rounds-beyond-any-run", RUN, r"^error: \S+c\.toml: the run asks for up to 15,000,000,000,000 local steps "
         r"\(\[run\] rounds = 1,000,000,000,000 x \[data\] clients = 3 \(every online device\) x 5 steps a task by "
         r"\[client\] local_steps\), more than any run finishes", **{"c.toml": config(run={"rounds": 10**12}, client={"local_steps": 5})}),
    case("rounds-x-cohort-beyond-any-run", "run quickstart --set run.rounds=100000000 --set server.clients_per_round=50 "
         "--set client.local_steps=1000 --quiet",
         r"x \[server\] clients_per_round = 50 x 1,000 steps a task by \[client\] local_steps\), more than any run finishes "
         r"\(at most 1,000,000,000,000\); lower \[run\] rounds, \[server\] clients_per_round or \[client\] local_steps$"),
    case("async-aggregations-beyond-any-run", RUN, r"x \[server\] buffer = 3 arrivals an aggregation x 100,000 steps a task "
         r"by \[client\] local_steps\), more than any run finishes \(at most 1,000,000,000,000\); lower \[run\] rounds, "
         r"\[server\] buffer or \[client\] local_steps$",
         **{"c.toml": config(run={"rounds": 10**7}, server={"mode": "async", "timing": "model", "buffer": 3}, client={"local_steps": 100000})}),
    case("local-epochs-full-batch-before-data", RUN, r"\[client\] local_epochs = 1 needs batch_size > 0",
         **{"c.toml": config(data={"dataset": "digits", "clients": 3}, client={"local_epochs": 1, "batch_size": 0})}),
    case("local-epochs-on-quadratic", RUN, r"\[client\] local_epochs = 2: the quadratic task has no samples to pass over; "
         r"set local_steps instead", **{"c.toml": config(client={"local_epochs": 2})}),
    case("algorithm-option-range-before-data", "run quickstart --set algorithm.name=fedlaavg --set algorithm.beta=1.5 "
         "--set run.algorithms=[] --quiet", r"^error: --set algorithm\.beta=1\.5: \[algorithm\] beta = 1\.5 for 'fedlaavg' must "
         r"be in \[0, 1\] \(fraction of all devices selected per round; 0 = use \[server\] clients_per_round\)$"),
    case("comparison-option-range-before-data", "run quickstart --set run.algorithms=[\"fedavg\",\"amplified\"] "
         "--set algorithm.eta=0 --quiet", r"\[algorithm\] eta = 0\.0 for 'amplified' must be > 0 \(amplification factor"),
    case("unknown-model-before-data", "run quickstart --set model.name=lenet --quiet",
         r"^error: --set model\.name=lenet: \[model\] name = 'lenet' is unknown; did you mean 'lenet5'\?"),
    case("per-round-beyond-devices-before-data", "run quickstart --set server.clients_per_round=101 --quiet",
         r"^error: --set server\.clients_per_round=101: \[server\] clients_per_round = 101 is more than the 100 "
         r"devices of the run"),
    # a user module of 11,718,750,010 parameters, counted on the meta device and never allocated
    *(case(f"{algorithm}-state-beyond-memory", f"run quickstart --set model.name=wide_i37:make --set run.algorithms=[] "
           f"--set algorithm.name={algorithm} --set server.clients_per_round=1 --quiet",
           rf"^error: a local step of the run needs about 4\.9\d TB of memory \(parameters, gradients and starts of 1 "
           rf"devices x 11,718,750,010 parameters: 141 GB; {algorithm}'s state \(its {table} of 100 devices x "
           rf"11,718,750,010 parameters\): 4\.\d+ TB\), more than 90% of the \S+ [GT]B of this machine; lower \[data\] clients "
           rf"\(fewer devices\) or \[model\] name, choose another \[algorithm\] name, or use .*with more memory$",
           **{"wide_i37.py": "from torch import nn\n\n\ndef make(in_shape, n_classes, cfg):\n"
                             "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10**10 // 64), nn.Linear(10**10 // 64, n_classes))\n"})
      for algorithm, table in (("mifa", "table"), ("fedvarp", "table"), ("fedlaavg", "table"), ("fedawe", "local"))),
    case("built-in-model-state-beyond-memory", "run quickstart --set model.name=mlp --set model.hidden=200000000 "
         "--set run.algorithms=[] --set algorithm.name=mifa --set server.clients_per_round=1 --quiet",
         r"mifa's state \(its table of 100 devices x 15,000,000,010 parameters\): 6\.18 TB\), more than 90% .*; lower "
         r"\[data\] clients \(fewer devices\) or \[model\] hidden, choose another \[algorithm\] name"),
    # a comparison whose first algorithm fits but whose second does not: refused before either runs
    case("comparison-member-state-beyond-memory", "run quickstart --set data.dataset=logistic --set data.dim=2 "
         "--set data.samples=200000 --set data.clients=100000 --set data.partition=iid --set model.name=mlp "
         "--set model.hidden=2500000 --set server.clients_per_round=1 --quiet",
         r"mifa's state \(its table of 100,000 devices x 32,500,010 parameters\): 13 TB; layer outputs"),
    #
    #
    #
    # --- trackers, reports, sweeps (issue 37) ---
    case("sweep-resume-study-toml-of-another-study", "sweep --resume {tmp}/runs/t --quiet",
         r"runs/t: holds a different study \(its run algorithm-fedavg_seed-0 ran with \[client\] lr = 0\.1, the study in "
         r"\S+/runs/t/study\.toml gives 0\.05\); its study\.toml is not the one these runs ran with: put that one back",
         runs=swept_then_replaced("--set", "client.lr=0.05")),
    case("sweep-resume-study-toml-with-other-axes", "sweep --resume {tmp}/runs/t --quiet",
         r"runs/t: holds a different study \(its run algorithm-fedavg_seed-1 is no point of the study in "
         r"\S+/runs/t/study\.toml\); its study\.toml is not the one these runs ran with",
         runs=swept_then_replaced("--set", "sweep.run.seed=[0]")),
    case("sweep-into-runs-of-another-study", "sweep {tmp}/s2.toml --quiet",
         r"runs/t: holds a different study \(its run algorithm-fedavg_seed-0 ran with \[client\] lr = 0\.1, the study in "
         r"\S+/s2\.toml gives 0\.05\); give this one another \[run\] name, or delete the folder",
         runs=swept_then_unrecorded, **{"s2.toml": quadratic_study().replace("lr = 0.1", "lr = 0.05")}),
    case("sweep-resume-changes-an-axis", "sweep --resume {tmp}/runs/t --set sweep.run.seed=[0,1,2]",
         r"--set 'sweep\.run\.seed=\[0,1,2\]': a study's axes cannot change on --resume \(its points are those it ran "
         r"with\); to run other values, start a new study from this one, which runs all its points in a new folder: "
         r"`fedsim sweep \S+/runs/t/study\.toml --set run\.name=t-2 --set run\.out=\S+/runs --set "
         r"'sweep\.run\.seed=\[0,1,2\]'`$", runs=swept()),
    case("sweep-folder-changes-an-axis", "sweep {tmp}/runs/t --set sweep.algorithm.name=[\"fedavg\"]",
         r"a study's axes cannot change on --resume .*`fedsim sweep \S+/runs/t/study\.toml --set run\.name=t-2 "
         r"--set run\.out=\S+/runs --set 'sweep\.algorithm\.name=\[\"fedavg\"\]'`$", runs=swept()),
    case("sweep-resume-changes-the-warm-start", "sweep --resume {tmp}/runs/t --set warm_start.client.lr=0.5",
         r"--set 'warm_start\.client\.lr=0\.5': a study's warm start cannot change on --resume", runs=swept()),
    #
    #
    #
    case("report-initial-not-an-object", "report {tmp}/r",
         r"r/manifest\.json: \"initial\" = 5 is not the initial model's evaluation \(an object of test_loss, test_acc, "
         r"t: numbers or null\); the file was edited or damaged: delete the entry",
         r=run_dir(lambda d: with_initial(d, 5))),
    case("report-initial-accuracy-a-string", "report {tmp}/r --target 0.5",
         r"^error: \S+/r/manifest\.json: \"initial\" = \{\"test_loss\": 1.0, \"test_acc\": \"high\", \"t\": 0.0\} is not",
         r=run_dir(lambda d: with_initial(d, {"test_loss": 1.0, "test_acc": "high", "t": 0.0}))),
    case("plot-initial-time-a-list", "plot {tmp}/r", r"\"initial\" = \{\"test_loss\": 1.0, \"test_acc\": null, \"t\": \[0\]\} is not",
         r=run_dir(lambda d: with_initial(d, {"test_loss": 1.0, "test_acc": None, "t": [0]}))),
    case("best-by-a-time-without-its-unit", "report {tmp}/runs/t --best-by final_los --over algorithm.name",
         r"^error: --best-by 'final_los': not a metric of the summary \(one of: best_acc, best_loss, final_acc, "
         r"final_loss\); did you mean 'final_loss'\?$", **{"s.toml": quadratic_study(), "runs": swept_then_claimed}),
    case("study-base-misspelled", "sweep {tmp}/s.toml",
         r"^error: \S+s\.toml: bse = 'quickstart' is not a \[section\] table; did you mean 'base'\? a study has "
         r"`base`, config sections and \[sweep\]$", **{"s.toml": 'bse = "quickstart"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("best-by-a-target-not-reported", "report {tmp}/runs/t --best-by time_to_0.9_s --over algorithm.name",
         r"^error: --best-by 'time_to_0\.9_s': not a metric of the summary \(one of: best_acc, best_loss, final_acc, "
         r"final_loss\); add --target 0\.9 to report it$", **{"s.toml": quadratic_study(), "runs": swept_then_claimed}),
    # --- trace scale, events log (issue 37) ---
    case("run-events-unknown", RUN, r"c\.toml: \[run\] events = 'some' is not valid; did you mean 'none'\? "
         r"\(one of: all, failures, none\)", **{"c.toml": config(run={"events": "some"})}),
    case("run-events-a-number", RUN, r"c\.toml: \[run\] events: expected a string, got 3 \(int\)",
         **{"c.toml": config(run={"events": 3})}),
    case("run-events-changed-on-resume", "run --resume {tmp}/r --set run.events=none --quiet",
         r"--set 'run\.events=none': run\.events cannot be changed when resuming", r=run_dir()),
    case("generate-bits-beyond-limit", "trace generate grid --devices 100000000 --rounds 400 --out {tmp}/t.parquet",
         r"trace generator 'grid': 100,000,000 devices over 400 rounds would take 5,000,000,000 bytes of "
         r"availability bits \(one per 8 devices and round\), above fedsim's limit of 4,294,967,296; use fewer "
         r"devices or rounds"),
    case("generate-bernoulli-rows-beyond-limit", "trace generate bernoulli --devices 50000 --rounds 20000 --set p=0.5 "
         "--out {tmp}/t.parquet", r"trace generator 'bernoulli': 50,000 devices over 20,000 rounds would make "
         r"2[0-9,]+ rows, above fedsim's limit of 50,000,000; generate fewer devices or rounds"),
    #
    # --- audit of the surfaces since d478d11: modules, local epochs, FLASH, fedbuff, halfnormal, run format, trace info|plot RUN_DIR ---
    # your own module: where it is, the factory, what it builds and what its forward returns
    case("module-named-by-its-file", RUN, r"^error: \[model\] name: 'audit_nets\.py:linear' names a file, not a module; "
         r"name the module: 'audit_nets:linear'", **{"c.toml": module_config("audit_nets.py:linear"), "audit_nets.py": nets}),
    case("module-name-without-module", RUN, r"\[model\] name: ':linear' is not of the form 'package\.module:Name'",
         **{"c.toml": module_config(":linear")}),
    case("module-file-missing", RUN, r"'no_such_nets:linear': no module 'no_such_nets' in the working directory or on "
         r"PYTHONPATH; check the name or add its folder to PYTHONPATH", **{"c.toml": module_config("no_such_nets:linear")}),
    case("module-factory-missing", RUN, r"'audit_nets:nope': module 'audit_nets' has no 'nope'",
         **user_module("nope")),
    case("module-file-syntax-error", RUN, r"importing 'broken_nets' failed \(SyntaxError: .*broken_nets\.py, line 1\)\); "
         r"fix the module", **{"c.toml": module_config("broken_nets:linear"), "broken_nets.py": "def linear(:\n"}),
    case("module-file-raises-on-import", RUN, r"importing 'raising_nets' failed \(RuntimeError: no GPU here\); fix the module",
         **{"c.toml": module_config("raising_nets:linear"), "raising_nets.py": python("raise RuntimeError('no GPU here')\n")}),
    case("module-factory-a-number", RUN, r"\[model\] name = 'audit_nets:WIDTH' is 64, which is not a function \(in_shape, "
         r"n_classes, model_config\) -> torch\.nn\.Module", **user_module("WIDTH")),
    case("module-factory-takes-two-arguments", RUN, r"'audit_nets:two_args' is a function that does not take fedsim's "
         r"arguments \(in_shape, n_classes, model_config\)", **user_module("two_args")),
    case("module-factory-raises", RUN, r"'audit_nets:raises': building the model failed \(RuntimeError: the weights are on "
         r"another machine\); fix the factory", **user_module("raises")),
    case("module-factory-returns-none", RUN, r"the factory returned NoneType None, not a torch\.nn\.Module; return the "
         r"module it builds", **user_module("returns_none")),
    case("module-factory-returns-a-class", RUN, r"the factory returned type <class 'torch\.nn\.modules\.linear\.Linear'>, "
         r"not a torch\.nn\.Module", **user_module("returns_class")),
    case("module-factory-returns-a-list-of-modules", RUN, r"the factory returned a list of Flatten, Linear, not a "
         r"torch\.nn\.Module; wrap them in torch\.nn\.Sequential\(\.\.\.\)", **user_module("returns_list")),
    case("module-only-frozen-parameters", RUN, r"'audit_nets:frozen': the module has no trainable parameters \(none with "
         r"requires_grad=True\)", **user_module("frozen")),
    case("module-complex-parameters", RUN, r"^error: \[model\] name = 'audit_nets:complex_linear': parameter '1\.weight' is "
         r"torch\.complex64; fedsim trains and averages real numbers: keep a complex weight as two real ones",
         **user_module("complex_linear")),
    case("module-parameters-on-meta", RUN, r"^error: \[model\] name = 'audit_nets:meta_linear': parameter '1\.weight' is on "
         r"the meta device \(a shape without values\); build the module with values in the factory",
         **user_module("meta_linear")),
    case("module-nan-parameters", RUN, r"^error: \[model\] name = 'audit_nets:nan_linear': parameter '1\.bias' holds nan or "
         r"inf as the factory built it \(fedsim sends and averages it, and inf - inf is nan\); give it finite numbers",
         **user_module("nan_linear")),
    case("module-returns-a-tuple", RUN, r"'audit_nets:returns_tuple': the module returns a tuple \(\[2, 10\], \[\]\) for a "
         r"batch of 2 inputs; it must return logits \[batch, 10\] alone: return them from forward \(or wrap the module",
         **user_module("returns_tuple")),
    case("module-returns-too-few-classes", RUN, r"the module returns \[2, 3\] for a batch of 2 inputs; it must return logits "
         r"\[batch, 10\] \(one per class of the dataset\)", **user_module("three_classes")),
    case("module-returns-class-indices", RUN, r"^error: \[model\] name = 'audit_nets:integer_logits': the module returns "
         r"logits of torch\.int64 for a batch of 2 inputs; it must return floating-point logits \[batch, 10\]",
         **user_module("integer_logits")),
    case("module-on-the-quadratic-task", RUN, r"\[model\] name = 'audit_nets:linear' does not apply to the quadratic task",
         **{"c.toml": config(model={"name": "audit_nets:linear"}), "audit_nets.py": nets}),
    case("module-key-of-its-own", RUN, r"unknown key \[model\] width for 'audit_nets:linear'; valid keys: dropout, hidden, "
         r"init, .*; a model plugin takes keys of its own that its factory declares \(`options`, docs/extending\.md\)$",
         **user_module("linear", width=32)),
    # local_buffers and train_flops_per_sample
    case("local-buffers-on-a-builtin-model", RUN, r"\[model\] name = 'logreg': \[model\] local_buffers = true, but the module has no "
         r"buffers \(running statistics\) to keep on the devices; set local_buffers = false", **{"c.toml": digits(model={"name": "logreg", "local_buffers": True})}),
    case("local-buffers-on-a-module-without-buffers", RUN, r"'audit_nets:linear': \[model\] local_buffers = true, but the "
         r"module has no buffers", **user_module("linear", local_buffers=True)),
    case("local-buffers-a-word", RUN, r"\[model\] local_buffers: expected true or false, got 'yes'",
         **{"c.toml": digits(model={"name": "logreg", "local_buffers": "yes"})}),
    case("flops-per-sample-a-word", RUN, r"\[model\] train_flops_per_sample: expected a number, got 'auto'",
         **{"c.toml": digits(model={"name": "logreg", "train_flops_per_sample": "auto"})}),
    # init_from
    case("init-from-missing-file", RUN, r"\[model\] init_from = '\S+/nope/model\.pt': no such file or run directory",
         **{"c.toml": digits(model={"name": "logreg", "init_from": "{tmp}/nope/model.pt"})}),
    case("init-from-a-number", RUN, r"\[model\] init_from: expected a string, got 3", **{"c.toml": config(model={"init_from": 3})}),
    case("init-from-damaged-model-pt", RUN, r"init_from = '\S+/r': \S+/r/model\.pt is not a readable checkpoint "
         r"\(RuntimeError\); give a model\.pt that a fedsim run wrote", r=run_dir(lambda path: (path / "model.pt").write_bytes(b"PK\x03\x04 cut")),
         **{"c.toml": digits(model={"name": "logreg", "init_from": "{tmp}/r"})}),
    case("init-from-another-models-run", RUN, r"the file has no parameter 'fc1\.weight', which this run's model has; set "
         r"\[model\] name and hidden and \[data\] dataset as in the run that saved it", r=run_dir(),
         **{"c.toml": digits(model={"name": "logreg", "init_from": "{tmp}/r"})}),
    case("init-from-another-dimension", RUN, r"parameter 'x' has shape \[2\] in the file but \[3\] in this run's model; "
         r"set \[data\] dim and targets", r=run_dir(),
         **{"c.toml": config(data={"targets": [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [2.0, 1.0, 0.0]]}, model={"init_from": "{tmp}/r"})}),
    case("init-from-an-empty-folder", RUN, r"init_from = '\S+/empty': the directory holds no model\.pt; give the directory "
         r"of a run that finished", empty=lambda path, run: path.mkdir(), **{"c.toml": config(model={"init_from": "{tmp}/empty"})}),
    case("init-from-a-comparison", RUN, r"init_from = '\S+/cmp' is a comparison of fedavg, mifa; name the algorithm's "
         r"sub-folder, e.g\. '\S+/cmp/fedavg'", cmp=comparison, **{"c.toml": config(model={"init_from": "{tmp}/cmp"})}),
    case("init-from-a-study", RUN, r"init_from = '\S+/s' is a study's folder; name one point's run directory, e\.g\. "
         r"'\S+/s/seed-0'$", s=study_folder, **{"c.toml": config(model={"init_from": "{tmp}/s"})}),
    case("init-from-a-list-of-tensors", RUN, r"m\.pt is not a readable checkpoint \(not a dict of named tensors\)",
         **{"m.pt": saved([1.0, 2.0]), "c.toml": config(model={"init_from": "{tmp}/m.pt"})}),
    case("init-from-a-config-file", RUN, r"init_from = '\S+/c\.toml': \S+/c\.toml is not a readable checkpoint "
         r"\(UnpicklingError\)", **{"c.toml": config(model={"init_from": "{tmp}/c.toml"})}),
    case("init-from-a-nan-model", RUN, r"^error: \S+c\.toml: \[model\] init_from = '\S+/m\.pt': parameter 'x' holds nan or "
         r"inf in the file; start from the model\.pt of a run that did not diverge, or leave init_from empty$",
         **{"m.pt": saved({"x": [float("nan"), 0.0]}), "c.toml": config(model={"init_from": "{tmp}/m.pt"})}),
    case("init-from-a-complex-model", RUN, r"parameter 'x' holds torch\.complex64 in the file",
         **{"m.pt": saved({"x": [1 + 2j, 0j]}), "c.toml": config(model={"init_from": "{tmp}/m.pt"})}),
    # local epochs
    case("local-epochs-on-the-quadratic-task", RUN, r"\[client\] local_epochs = 1: the quadratic task has no samples to "
         r"pass over; set local_steps instead", **{"c.toml": config(client={"local_epochs": 1.0, "batch_size": 4})}),
    case("local-epochs-with-full-batches", RUN, r"\[client\] local_epochs = 1 needs batch_size > 0 to cut each epoch into "
         r"minibatches", **{"c.toml": digits(model={"name": "logreg"}, client={"local_epochs": 1.0, "batch_size": 0})}),
    case("local-epochs-negative", RUN, r"\[client\] local_epochs = -1\.0 must be >= 0 \(0 = local_steps steps",
         **{"c.toml": digits(model={"name": "logreg"}, client={"local_epochs": -1.0})}),
    # FLASH's round rules
    case("deadline-sigma-under-ideal-timing", RUN, r"\[server\] deadline_sigma means nothing under timing = 'ideal'.*; "
         r"remove it or set timing = 'model'", **{"c.toml": config(server={"deadline_sigma": 5.0})}),
    case("min-selected-above-the-devices", RUN, r"\[server\] min_selected = 4 is more than the 3 devices \(\[data\] "
         r"clients\): no round could ever start", **{"c.toml": config(server={"timing": "model", "min_selected": 4})}),
    case("min-selected-never-reached-by-the-trace", RUN, r"^error: \S+c\.toml: \[server\] min_selected = 2: the trace "
         r"never has 2 devices online at once \(at most 1, over its 1\.67 min\), so no round could start; lower it",
         **{"t.parquet": trace(start=[0.0, 40.0, 80.0], end=[30.0, 70.0, 100.0]),
            "c.toml": config("{tmp}/t.parquet", server={"timing": "model", "min_selected": 2})}),
    case("min-selected-a-fraction", RUN, r"\[server\] min_selected: expected an integer, got 2\.5",
         **{"c.toml": config(server={"timing": "model", "min_selected": 2.5})}),
    case("update-frac-above-1", RUN, r"\[server\] update_frac = 1\.5 must be in \[0, 1\]",
         **{"c.toml": config(server={"timing": "model", "update_frac": 1.5})}),
    case("update-frac-in-async", RUN, r"\[server\] update_frac is a rule of synchronous rounds, not of mode = 'async'; "
         r"remove it or set mode = 'sync'", **{"c.toml": config(server={"timing": "model", "mode": "async", "update_frac": 0.5})}),
    # fedbuff and async mode
    case("async-buffer-zero", RUN, r"\[server\] buffer = 0 must be >= 1",
         **{"c.toml": config(server={"timing": "model", "mode": "async", "buffer": 0})}),
    case("async-mifa-warmup", RUN, r"\[algorithm\] 'mifa' with warmup = true cannot run with \[server\] mode = 'async'.*"
         r"or warmup = false", **{"c.toml": config(server={"timing": "model", "mode": "async"}, algorithm={"name": "mifa", "warmup": True})}),
    case("async-sequential-sgd", RUN, r"\[algorithm\] 'sequential-sgd' cannot run with \[server\] mode = 'async'",
         **{"c.toml": config(server={"timing": "model", "mode": "async"}, algorithm={"name": "sequential-sgd"})}),
    case("async-comparison-with-fedavg-wait", RUN, r"\[algorithm\] 'fedavg-wait' cannot run with \[server\] mode = 'async'",
         **{"c.toml": config(server={"timing": "model", "mode": "async"}, run={"algorithms": ["fedbuff", "fedavg-wait"]})}),
    case("async-deadline-shorter-than-any-task", RUN, r"^error: \S+c\.toml: \[server\] deadline = 0\.001 s is shorter than "
         r"any device's quickest task \([0-9.]+ ms: download, its local steps, upload\), so in mode = 'async' no update "
         r"would ever arrive and the buffer never fills; raise the deadline",
         **{"c.toml": config(server={"timing": "model", "mode": "async", "deadline": 0.001})}),
    # the one device quick enough is never online in its 5 trace rounds (it hung, inviting the others forever)
    case("async-deadline-met-only-by-devices-never-online", RUN, r"^error: \S+c\.toml: \[server\] "
         r"deadline = 0\.03 s: only device 7 finishes a task within it, and the trace never has it online, so in "
         r"mode = 'async' no update would ever arrive and the buffer never fills; raise the deadline",
         **{"c.toml": dump_toml({"run": {"name": "r", "out": "{tmp}/runs", "rounds": 5, "progress": False,
                                         "plots": False},
                                 "data": {"dataset": "digits", "clients": 20}, "trace": {"source": "bernoulli", "p": 0.6},
                                 "server": {"timing": "model", "mode": "async", "buffer": 3, "deadline": 0.03}})}),
    case("fedbuff-unknown-option", RUN, r"unknown key \[algorithm\] staleness_exponent for 'fedbuff'",
         **{"c.toml": config(server={"timing": "model", "mode": "async"}, algorithm={"name": "fedbuff", "staleness_exponent": 0.5})}),
    # halfnormal device speeds
    case("halfnormal-misspelt", RUN, r"\[devices\] model = 'half-normal' is not valid; did you mean 'halfnormal'\?",
         **{"c.toml": config(server={"timing": "model"}, devices={"model": "half-normal"})}),
    case("halfnormal-with-classes", RUN, r"\[devices\] classes applies to model = 'profiles', not 'halfnormal'",
         **{"c.toml": config(server={"timing": "model"}, devices={"model": "halfnormal", "classes": ["phone-low"]})}),
    case("halfnormal-with-bandwidth-sigma", RUN, r"\[devices\] bandwidth_sigma applies to model = 'lognormal', not 'halfnormal'",
         **{"c.toml": config(server={"timing": "model"}, devices={"model": "halfnormal", "bandwidth_sigma": 1.0})}),
    # trace info and trace plot of a run directory
    case("trace-info-of-an-empty-folder", "trace info {tmp}/empty", r"empty: is a directory; give the path of a \.parquet "
         r"file, or a run directory that `fedsim run` made", empty=lambda path, run: path.mkdir()),
    case("trace-plot-of-an-empty-folder", "trace plot {tmp}/empty --out {tmp}/p.png", r"empty: is a directory; give the "
         r"path of a \.parquet file", empty=lambda path, run: path.mkdir()),
    case("trace-info-of-a-study-folder", "trace info {tmp}/s", r"^error: \S+/s: is a study's folder, whose points may "
         r"replay different traces; give one point's run directory, e\.g\. \S+/s/seed-0$", s=study_folder),
    case("trace-info-of-a-run-without-config", "trace info {tmp}/r", r"^error: \S+/r/config\.toml: missing, so the trace "
         r"the run replays is unknown; restore it", r=run_dir(lambda path: (path / "config.toml").unlink())),
    case("trace-info-of-a-run-with-damaged-config", "trace info {tmp}/r", r"r/config\.toml: invalid TOML",
         r=run_dir(lambda path: (path / "config.toml").write_text("[run\n"))),
    case("trace-info-of-a-run-with-damaged-manifest", "trace info {tmp}/r", r"r/manifest\.json: damaged \(not a JSON object\)",
         r=run_dir(lambda path: (path / "manifest.json").write_text("[1]"))),
    case("trace-info-of-a-run-with-a-trace-record-of-text", "trace info {tmp}/r", r"^error: \S+/r/manifest\.json: damaged "
         r"\(trace = 't\.parquet' is not a table\); restore it, or delete its \"trace\" entry to read the run's trace "
         r"without checking it against the record$",
         r=run_dir(lambda path: edit_manifest(path, trace="t.parquet"))),
    case("trace-info-of-a-generated-trace-run-with-a-damaged-record", "trace info {tmp}/runs/t", r"^error: \S+/manifest\.json: "
         r"damaged \(trace\.horizon = 'long' is not a number of seconds\)",
         **{"c.toml": config(), "runs": run_then(lambda run: edit_manifest(run, trace={"fingerprint": "abc", "horizon": "long"}))}),
    case("trace-info-of-a-generated-trace-run-of-another-fingerprint", "trace info {tmp}/runs/t", r"\[trace\] source = "
         r"'always' now generates another trace than the run started with",
         **{"c.toml": config(), "runs": run_then(lambda run: edit_manifest(run, trace={**read_json(run / "manifest.json")["trace"],
                                                                                        "fingerprint": "0" * 64}))}),
    case("trace-info-of-a-run-whose-trace-is-gone", "trace info {tmp}/runs/t", r"t\.parquet: the run's trace file is gone "
         r"\(moved or deleted; it had \d+ bytes", **{"t.parquet": trace(), "c.toml": config("{tmp}/t.parquet"), "runs": run_then(
             lambda run: (run.parents[1] / "t.parquet").unlink())}),
    case("trace-plot-of-a-run-whose-trace-changed", "trace plot {tmp}/runs/t --out {tmp}/p.png", r"t\.parquet: the trace file "
         r"changed since the run started", **{"t.parquet": trace(), "c.toml": config("{tmp}/t.parquet"), "runs": run_then_replace_trace}),
    case("trace-info-of-a-run-devices-missing", "trace info {tmp}/r --devices {tmp}/nope.parquet",
         r"device table \S+/nope\.parquet: file not found", r=run_dir()),
    case("trace-plot-of-a-run-by-its-devices-without-zones", "trace plot {tmp}/r --out {tmp}/p.png --devices {tmp}/r/devices.parquet",
         r"device table \S+/r/devices\.parquet: has no tz_offset or group column; give a device table with one", r=run_dir()),
    case("trace-plot-of-a-run-file", "trace plot {tmp}/r/model.pt --out {tmp}/p.png", r"trace \S+/r/model\.pt: not a "
         r"readable Parquet file", r=run_dir()),
    # --- issue 38: module semantics ---
    case("local-epochs-with-batchnorm-batched", RUN, r"^error: \[client\] trainer = 'batched': .*its BatchNorm "
         r"would count the padding of an epoch's last, smaller minibatch \(local_epochs = 1\) in its batch statistics\); "
         r"set trainer = 'loop' \(or 'auto'\)$",
         **user_module("batchnorm", client={"local_epochs": 1.0, "batch_size": 5, "trainer": "batched"})),
    case("local-epochs-with-batchnorm-on-one-sample", RUN, r"\[client\] local_epochs = 1: device 0 has 449 samples, so its "
         r"epochs end on a minibatch of one sample \(batch_size = 4\), on which the module's BatchNorm cannot compute "
         r"batch statistics; set batch_size = 5 \(no device then leaves one sample\) or local_steps$",
         **user_module("batchnorm", client={"local_epochs": 1.0, "trainer": "loop"})),
    *[case(f"batchnorm-on-one-sample-{trainer}", RUN, r"^error: \[model\] name = 'audit_nets:batchnorm': its "
           r"BatchNorm1d '2' cannot train on a minibatch of one sample \(one value per feature has no variance; torch "
           r"raises\); set \[client\] batch_size >= 2$",
           **user_module("batchnorm", client={"batch_size": 1, "trainer": trainer})) for trainer in ("batched", "loop")],
    case("batchnorm-without-momentum-on-one-sample", RUN, r"^error: \[model\] name = 'audit_nets:batchnorm_average': "
         r"the module cannot train on a batch of 1 samples: its forward raised ValueError \(Expected more than 1 value "
         r"per channel when training, .* in torch\.nn\.functional\.batch_norm; set \[client\] batch_size >= 2$",
         **user_module("batchnorm_average", client={"batch_size": 1})),
    *[case(f"module-draws-random-numbers-{trainer}", RUN, r"^error: \[model\] name = 'audit_nets:noisy': the "
           r"module draws random numbers other than dropout \(aten\.randn_like\); fedsim keys only dropout "
           r"\(nn\.Dropout, nn\.Dropout1d/2d/3d, attention dropout\) by \(seed, round, device, step\), so that runs "
           r"repeat and resume exactly: use one of those, or take the draw out of the forward$",
           **user_module("noisy", client={"trainer": trainer})) for trainer in ("batched", "loop")],
    case("module-integer-buffer-beyond-float32", RUN, r"'audit_nets:huge_buffer': buffer 'hash' holds the integer "
         r"1099511627776, beyond 2\*\*24, which fedsim's float32 copy of the state \(sent and averaged\) cannot hold "
         r"exactly; keep such numbers out of buffers", **user_module("huge_buffer")),
    # --- issue 38: modules fedsim cannot train ---
    *[case(f"module-changes-a-parameter-in-place-{trainer}", RUN, r"^error: \[model\] name = 'audit_nets:clamped': "
           r"the module's forward changes parameter 'fc\.weight' in place \(aten\.clamp_\), behind the optimiser's "
           r"back: .*; compute a new tensor from it instead \(w\.clamp\(-1, 1\), not w\.data\.clamp_\) or register "
           r"a parametrization \(torch\.nn\.utils\.parametrize\)$",
           **user_module("clamped", client={"trainer": trainer})) for trainer in ("loop", "batched", "auto")],
    case("module-adds-to-a-parameter-under-no-grad", RUN, r"'audit_nets:nudged': the module's forward changes "
         r"parameter 'fc\.bias' in place \(aten\.add_\)", **user_module("nudged")),
    case("module-assigns-a-parameters-data", RUN, r"'audit_nets:data_set': the module's forward changes parameter "
         r"'fc\.weight' in place \(\.data =\)", **user_module("data_set", client={"trainer": "loop"})),
    case("module-replaces-a-parameter", RUN, r"'audit_nets:weight_replaced': the module's forward assigns a new "
         r"tensor to 'fc\.weight', which fedsim never sees \(it trains and sends the tensor it passed in\); compute "
         r"a new tensor from it in forward", **user_module("weight_replaced")),
    case("module-replaces-a-buffer", RUN, r"'audit_nets:buffer_replaced': the module's forward assigns a new tensor "
         r"to 'mean', .*; update it in place under torch\.no_grad\(\) \(self\.mean\.mul_\(0\.9\)\.add_\(\.\.\.\)\), as "
         r"BatchNorm updates its running statistics$", **user_module("buffer_replaced")),
    case("module-counts-its-calls", RUN, r"'audit_nets:counted': the module's forward changes its attribute 'calls' "
         r"at every call \(1 -> 2\): state outside its tensors, .*; keep it in a buffer \(register_buffer, updated in "
         r"place\) or compute it from the input$", **user_module("counted", client={"trainer": "loop"})),
    *[case(f"module-{factory}-batched", RUN, r"^error: \[client\] trainer = 'batched': the model cannot train batched "
           rf"under torch\.func\.vmap \(its forward calls {call}, whose output's shape depends on the data; give it a "
           r"fixed shape \(torch\.where, or multiply by the mask\)\); set trainer = 'loop' \(or 'auto'\)$",
           **user_module(factory, client={"trainer": "batched"}))
      for factory, call in (("masked", r"x\[mask\] \(indexing by a boolean mask\)"), ("nonzero", r"torch\.nonzero"),
                            ("unique", r"torch\.unique"))],
    *[case(f"module-{factory}-batched", RUN, r"^error: \[client\] trainer = 'batched': the model cannot train batched "
           rf"under torch\.func\.vmap \(its forward calls {call}, which reads a tensor's value on the host; keep the "
           r"value a tensor \(tensor arithmetic, torch\.where instead of an if\)\); set trainer = 'loop' \(or 'auto'\)$",
           **user_module(factory, client={"trainer": "batched"}))
      for factory, call in (("item", r"Tensor\.item\(\)"), ("tolist", r"Tensor\.tolist\(\)"),
                            ("as_float", r"float\(\) of a tensor"),
                            ("branches", r"bool\(\) of a tensor \(an if, and, or, while on its value\)"))],
    # --- issue 38: training rules ---
    case("resume-rules-unknown", "run --resume {tmp}/r --set run.rounds=4 --quiet", r"r/checkpoint\.pt: rules = 99 is not "
         rf"training rules this release knows \(1 to {CURRENT_RULES}\); the file was edited or damaged",
         r=run_dir(checkpoint_says(rules=99))),
    case("resume-rules-a-string", "run --resume {tmp}/r --set run.rounds=4 --quiet", r"r/checkpoint\.pt: rules = '2' is not "
         r"training rules this release knows", r=run_dir(checkpoint_says(rules="2"))),
    # --- issue 39: power-of-choice selection ---
    case("power-of-choice-without-a-budget", "run quickstart --set algorithm.selection='power-of-choice'",
         r"^error: --set algorithm\.selection='power-of-choice': \[algorithm\] selection = 'power-of-choice' invites the "
         r"clients_per_round "
         r"candidates with the highest loss, but \[server\] clients_per_round = 0 invites every online device; set "
         r"clients_per_round > 0$"),
    *[case(f"power-of-choice-candidates-{d}", "run quickstart --set algorithm.selection='power-of-choice' --set "
           f"server.clients_per_round=10 --set algorithm.candidates={d}{more}", rf"\[algorithm\] candidates = {d} "
           rf"must be at least the {invited} devices invited per round{why} and at most \[data\] clients = 100; give "
           r"a value in that range, or 0 for twice the devices invited$")
      for d, more, invited, why in ((3, "", 10, ""), (500, "", 10, ""),
                                    (12, " --set server.overcommit=0.5", 15, r" \(clients_per_round with overcommit\)"))],
    case("power-of-choice-candidates-without-it", "run quickstart --set algorithm.candidates=12",
         r"unknown key \[algorithm\] candidates; it is a key of \[algorithm\] selection = 'power-of-choice': set "
         r"that selection, or remove it$"),
    case("power-of-choice-negative-candidates", "run quickstart --set algorithm.selection='power-of-choice' --set "
         "server.clients_per_round=10 --set algorithm.candidates=-1",
         r"\[algorithm\] candidates = -1 must be at least the 10 devices invited per round"),
    case("power-of-choice-async", "run quickstart --set algorithm.selection='power-of-choice' --set "
         "server.clients_per_round=10 --set server.mode='async'", r"\[algorithm\] selection = 'power-of-choice' is a "
         r"rule of synchronous rounds, not of \[server\] mode = 'async'; set mode = 'sync' or another selection$"),
    case("power-of-choice-fedavg-wait", "run quickstart --set algorithm.selection='power-of-choice' --set "
         "server.clients_per_round=10 --set algorithm.name='fedavg-wait' --set run.algorithms=[]", r"\[algorithm\] selection = "
         r"'power-of-choice' does not apply to \[algorithm\] 'fedavg-wait' \(it does not invite through the "
         r"selection policy\); remove the selection or choose another algorithm$"),
    # --- issue 39: fedasync and the server optimizers adagrad, yogi ---
    case("server-optimizer-unknown", "run quickstart --set algorithm.server_optimizer='yogy'",
         r"^error: --set algorithm\.server_optimizer='yogy': \[algorithm\] server_optimizer = 'yogy' is not valid; did you mean 'yogi'\? \(one of: sgd, momentum, "
         r"adam, adagrad, yogi\)$"),
    case("fedasync-in-sync-rounds", RUN, r"^error: \S+c\.toml: \[algorithm\] name = 'fedasync' mixes each update into the model "
         r"as it arrives \(Xie et al\.\), which needs \[server\] mode = 'async' and buffer = 1; set both, or choose "
         r"another algorithm for synchronous rounds$", **{"c.toml": config(algorithm={"name": "fedasync"})}),
    case("fedasync-in-a-sync-comparison", RUN, r"\[run\] algorithms \(with 'fedasync'\) mixes each update .* needs \[server\] mode = "
         r"'async'", **{"c.toml": config(run={"algorithms": ["fedavg", "fedasync"]})}),
    case("algorithm-known-as-fedadam", "run quickstart --set run.algorithms=[\"fedavg\",\"FedAdam\"]",
         r"^error: --set run\.algorithms=\[\"fedavg\",\"FedAdam\"\]: \[run\] algorithms = 'FedAdam' is unknown by that name: "
         r"it is 'fedavg' with \[algorithm\] server_optimizer = 'adam' \(one of: fedavg, "),
    case("algorithm-known-as-oort", "run quickstart --set algorithm.name=oort --set run.algorithms=[]",
         r"^error: --set algorithm\.name=oort: \[algorithm\] name = 'oort' is unknown by that name: it is a selection "
         r"policy: \[algorithm\] selection = 'oort' "),
    case("fedasync-beside-fedbuff", "run quickstart --set server.mode=async --set run.algorithms=[\"fedbuff\",\"fedasync\"]",
         r"buffer = 10 must be 1 .*; set \[server\] buffer = 1; to compare it with algorithms of a larger buffer, sweep "
         r"them in a study with zip = \[\[\"algorithm\.name\", \"server\.buffer\"\]\] \(docs/studies\.md\)$"),
    case("fedasync-by-set-with-a-buffer", "run quickstart --set server.mode=async --set algorithm.name=fedasync "
         "--set run.algorithms=[]", r"^error: --set algorithm\.name=fedasync: \[algorithm\] name = 'fedasync' applies "
         r"every arrival on its own, so \[server\] buffer = 10 must be 1 "),
    case("fedasync-with-a-buffer", RUN, r"^error: \S+c\.toml: \[algorithm\] name = 'fedasync' applies every arrival on its own, "
         r"so \[server\] buffer = 10 must be 1 \(each arrival one aggregation, its staleness counted in them\); set "
         r"\[server\] buffer = 1$", **{"c.toml": config(algorithm={"name": "fedasync"},
                                                        server={"mode": "async", "timing": "model"})}),
    *[case(f"fedasync-{key}-out-of-range", RUN, rf"^error: \S+c\.toml: \[algorithm\] {key} = {shown} for 'fedasync' "
           rf"must be {bound} \(", **{"c.toml": config(algorithm={"name": "fedasync", key: value, **extra},
                                                        server={"mode": "async", "timing": "model", "buffer": 1})})
      for key, value, shown, bound, extra in (
          ("mixing", 0.0, r"0\.0", r"in \(0, 1\]", {}), ("mixing", 1.5, r"1\.5", r"in \(0, 1\]", {}),
          ("poly_a", -0.5, r"-0\.5", ">= 0", {}), ("hinge_a", -1.0, r"-1\.0", ">= 0", {"staleness": "hinge"}),
          ("hinge_b", -2.0, r"-2\.0", ">= 0", {"staleness": "hinge"}), ("rho", -0.1, r"-0\.1", ">= 0", {}))],
    case("fedasync-staleness-unknown", RUN, r"^error: \S+c\.toml: \[algorithm\] staleness = 'hinged' for 'fedasync' is "
         r"not valid; did you mean 'hinge'\? \(one of: constant, polynomial, hinge\)$",
         **{"c.toml": config(algorithm={"name": "fedasync", "staleness": "hinged"},
                             server={"mode": "async", "timing": "model", "buffer": 1})}),
    case("fedasync-hinge-key-for-polynomial", RUN, r"^error: \S+c\.toml: \[algorithm\] hinge_b applies to staleness = "
         r"'hinge' only \(fedasync's staleness is 'polynomial'\); remove it or set staleness = 'hinge'$",
         **{"c.toml": config(algorithm={"name": "fedasync", "hinge_b": 2.0},
                             server={"mode": "async", "timing": "model", "buffer": 1})}),
    case("fedasync-poly-key-for-constant", RUN, r"\[algorithm\] poly_a applies to staleness = 'polynomial' only",
         **{"c.toml": config(algorithm={"name": "fedasync", "staleness": "constant", "poly_a": 1.0},
                             server={"mode": "async", "timing": "model", "buffer": 1})}),
    # --- issue 39: partial work ([client] work) ---
    case("work-unknown", "run quickstart --set client.work='half'",
         r"^error: --set client.work='half': \[client\] work = 'half' is not valid \(one of: full, fit-deadline\)"),
    case("work-fit-deadline-ideal-timing", "run quickstart --set client.work='fit-deadline' --set server.timing='ideal'",
         r"^error: .*\[client\] work = 'fit-deadline' needs device speeds, which timing = 'ideal' does not have "
         r"\(every device finishes its task within the round\); set \[server\] timing = 'model' or work = 'full'$"),
    # --- issue 39: oort selection ---
    *[case(f"oort-{key.replace('_', '-')}-out-of-range", f"run quickstart --set algorithm.selection='oort' "
           f"--set algorithm.{key}={value}", rf"\[algorithm\] {key} = {re.escape(shown)} for 'oort' must be {bound} \(")
      for key, value, shown, bound in (
          ("oort_exploration_factor", "1.5", "1.5", r"in \[0, 1\]"),
          ("oort_exploration_decay", "-0.1", "-0.1", r"in \[0, 1\]"),
          ("oort_exploration_min", "2", "2.0", r"in \[0, 1\]"),
          ("oort_round_threshold", "0", "0.0", r"in \(0, 100\]"),
          ("oort_round_penalty", "-1", "-1.0", ">= 0"),
          ("oort_clip_bound", "1.2", "1.2", r"in \[0, 1\]"),
          ("oort_cut_off_util", "-0.5", "-0.5", r"in \[0, 1\]"),
          ("oort_sample_window", "0.5", "0.5", ">= 1"),
          ("oort_pacer_step", "0", "0", ">= 1"),
          ("oort_pacer_delta", "101", "101.0", r"in \[0, 100\]"))],
    case("oort-pacer-step-not-an-integer", "run quickstart --set algorithm.selection='oort' --set "
         "algorithm.oort_pacer_step=2.5", r"\[algorithm\] oort_pacer_step: expected an integer, got 2\.5"),
    case("oort-key-without-oort", "run quickstart --set algorithm.oort_round_penalty=1",
         r"unknown key \[algorithm\] oort_round_penalty; it is a key of \[algorithm\] selection = 'oort': set "
         r"that selection, or remove it$"),
    # --- issue 39: scaffold and feddyn ---
    *(case(f"{algorithm}-state-beyond-memory", f"run quickstart --set model.name=wide_i39:make --set run.algorithms=[] "
           f"--set algorithm.name={algorithm} --set server.clients_per_round=1 --quiet",
           rf"^error: a local step of the run needs about 4\.9\d TB of memory \(parameters, gradients and starts of 1 "
           rf"devices x 11,718,750,010 parameters: 141 GB; {algorithm}'s state \(its {table} of 100 devices x "
           rf"11,718,750,010 parameters\): 4\.\d+ TB\), more than 90% of the \S+ [GT]B of this machine; lower \[data\] clients "
           rf"\(fewer devices\) or \[model\] name, choose another \[algorithm\] name, or use .*with more memory$",
           **{"wide_i39.py": "from torch import nn\n\n\ndef make(in_shape, n_classes, cfg):\n"
                             "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10**10 // 64), nn.Linear(10**10 // 64, n_classes))\n"})
      for algorithm, table in (("scaffold", "controls"), ("feddyn", "gradients"))),
    case("feddyn-alpha-zero", "run quickstart --set run.algorithms=[] --set algorithm.name=feddyn --set algorithm.alpha=0 "
         "--quiet", r"^error: --set algorithm\.alpha=0: \[algorithm\] alpha = 0\.0 for 'feddyn' must be > 0 \(weight of the "
         r"dynamic regulariser; the paper tries 0\.1, 0\.01 and 0\.001\)$"),
    case("feddyn-alpha-in-a-comparison", "run quickstart --set run.algorithms=['fedavg','feddyn'] --set algorithm.alpha=-1 "
         "--quiet", r"^error: --set algorithm\.alpha=-1: \[algorithm\] alpha = -1\.0 for 'feddyn' must be > 0"),
    case("feddyn-alpha-a-string", "run quickstart --set run.algorithms=[] --set algorithm.name=feddyn "
         "--set algorithm.alpha=big --quiet", r"^error: --set algorithm\.alpha=big: \[algorithm\] alpha: expected a "
         r"number, got 'big' \(str\)$"),
    case("scaffold-has-no-alpha", "run quickstart --set run.algorithms=[] --set algorithm.name=scaffold "
         "--set algorithm.alpha=0.1 --quiet", r"^error: --set algorithm\.alpha=0\.1: unknown key \[algorithm\] alpha "
         r"for 'scaffold'; valid keys: name, selection, server_"),
    # --- issue 40: studies on a Ray cluster ---
    case("ray-address-nobody-answers", "sweep {tmp}/s.toml --backend ray --address 127.0.0.1:1",
         r"^error: (--address 127\.0\.0\.1:1: no Ray cluster answers there \(Connection refused\); start one with "
         r"`ray start --head`, or leave out --address and RAY_ADDRESS for a local Ray|the Ray backend needs ray: .*)$",
         **{"s.toml": 'base = "quickstart"\n[run]\nout = "runs"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    # --- issue 40: lockstep shares in worker processes ---
    case("sweep-processes-with-ray", "sweep {tmp}/s.toml --backend ray --processes 2",
         r"^error: --processes 2: applies to the in-process backend \(Ray runs each point as a task of its own\); "
         r"leave it out with --backend ray$",
         **{"s.toml": 'base = "quickstart"\n[run]\nout = "runs"\n[sweep]\n"run.seed" = [0, 1]\n'}),
    case("sweep-processes-negative", "sweep {tmp}/s.toml --processes -1",
         r"^error: --processes -1: not a number of processes; give 1 or more, or leave it out \(one per 8 points, "
         r"at most one per core\)$",
         **{"s.toml": 'base = "quickstart"\n[run]\nout = "runs"\n[sweep]\n"run.seed" = [0, 1]\n'}),
]


# a study records what it is (study.toml) before its points are checked, so that it can be resumed
ALLOWED_NEW = {"sweep-point-beyond-memory": {"runs/s/study.toml"}}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished quadratic run (2 rounds) replaying the trace file t.parquet beside it."""
    from fedsim.traces import Trace, write_trace

    root = tmp_path_factory.mktemp("finished")
    write_trace(Trace.from_intervals([0, 1, 2], [0.0] * 3, [100.0] * 3, n_devices=3, horizon=100.0),
                root / "t.parquet")
    (root / "c.toml").write_text(config(str(root / "t.parquet")).replace("{tmp}", str(root)))
    assert main(["run", str(root / "c.toml"), "--quiet"]) == 0
    return root / "runs" / "t"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_the_catalogue_is_large_enough():
    assert len(CASES) >= 60


@pytest.mark.parametrize("argv, says, files", CASES)
def test_a_bad_input_is_one_line(argv, says, files, tmp_path, monkeypatch, capsys, finished_run, request):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path, finished_run)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("{tmp}", str(tmp_path)))
    capsys.readouterr()
    before = snapshot(tmp_path)
    try:
        code = main([arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    except SystemExit as exit:  # argparse
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    assert re.search(says, err), err
    after = snapshot(tmp_path)
    assert {name: after.get(name) for name in before} == before, "a file that was there changed"
    assert set(after) - set(before) <= ALLOWED_NEW.get(request.node.callspec.id, set()), "a file was written"


@pytest.mark.parametrize("damage", ["{", "[1]"])
def test_a_resume_reads_a_damaged_manifest_as_none_and_writes_it_again(tmp_path, finished_run, capsys, damage):
    run = tmp_path / "r"
    shutil.copytree(finished_run, run)
    (run / "manifest.json").write_text(damage)
    assert main(["run", "--resume", str(run), "--set", "run.rounds=3", "--quiet"]) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["rounds"] == 3


def test_a_learning_rate_beyond_float32_diverges_instead_of_crashing(tmp_path, capsys):
    body = config(client={"lr": 1e308})
    (tmp_path / "c.toml").write_text(body.replace("{tmp}", str(tmp_path)))
    assert main(["run", str(tmp_path / "c.toml"), "--quiet"]) == 3
    manifest = json.loads(next((tmp_path / "runs").glob("*/manifest.json")).read_text())
    assert manifest["status"] == "diverged" and "non-finite" in manifest["reason"]


@pytest.fixture
def full_disk(monkeypatch):
    """A set of file names: every write of a file of such a name fails as on a full disk: its
    temporary file is /dev/full, so the real writers (pyarrow, polars, torch, matplotlib, text)
    meet a real ENOSPC, while counting what the file needs still works."""
    import os
    import tempfile
    from types import SimpleNamespace

    import fedsim.files

    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full (Linux)")
    full: set[str] = set()

    def mkstemp(dir, prefix, suffix):
        fd, tmp = tempfile.mkstemp(dir=dir, prefix=prefix, suffix=suffix)
        if prefix.removeprefix(".").removesuffix(".") in full:
            os.unlink(tmp)
            os.symlink("/dev/full", tmp)
        return fd, tmp

    monkeypatch.setattr(fedsim.files, "tempfile", SimpleNamespace(mkstemp=mkstemp))
    return full


def disk_full_line(err: str, path: Path) -> None:
    """ONE line naming the file, what it needs and what to do."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.fullmatch(rf"error: {re.escape(str(path))}: no space left on device \(the file needs [0-9.]+ (bytes|kB|MB)"
                        r"[^)]*\); free some space, then run the command again.*\n", err), err


RUN_FILES = ["config.toml", "manifest.json", "checkpoint.pt", "rounds.parquet", "devices.parquet",
             "events.parquet", "model.pt"]


@pytest.mark.parametrize("name", RUN_FILES)
def test_a_full_disk_names_the_run_file_and_what_it_needs(name, tmp_path, capsys, full_disk, finished_run):
    (tmp_path / "c.toml").write_text(config(str(finished_run.parent.parent / "t.parquet")).replace("{tmp}", str(tmp_path)))
    full_disk.add(name)
    assert main(["run", str(tmp_path / "c.toml"), "--quiet"]) == 2
    disk_full_line(capsys.readouterr().err, tmp_path / "runs" / "t" / name)
    assert not list((tmp_path / "runs").rglob(f".{name}.*")), "a temporary file was left behind"


def test_a_full_disk_keeps_the_checkpoint_a_resume_goes_on_from(tmp_path, capsys, full_disk, finished_run):
    run = tmp_path / "r"
    shutil.copytree(finished_run, run)
    kept = {name: (run / name).read_bytes() for name in ("checkpoint.pt", "rounds.parquet")}
    full_disk.add("rounds.parquet")
    assert main(["run", "--resume", str(run), "--set", "run.rounds=4", "--quiet"]) == 2
    disk_full_line(capsys.readouterr().err, run / "rounds.parquet")
    assert (run / "rounds.parquet").read_bytes() == kept["rounds.parquet"]
    full_disk.clear()  # space again
    assert main(["run", "--resume", str(run), "--set", "run.rounds=4", "--quiet"]) == 0
    assert json.loads((run / "manifest.json").read_text())["rounds"] == 4


@pytest.mark.parametrize("argv, name", [
    ("trace generate always --devices 3 --days 1 --out {tmp}/g.parquet", "g.parquet"),
    ("trace convert --from csv {tmp}/in.csv --out {tmp}/out.parquet", "out.parquet"),
    ("trace convert --from csv {tmp}/in.csv --out {tmp}/out.parquet", "out.devices.parquet"),
    ("trace plot {tmp}/t.parquet --out {tmp}/p.png", "p.png"),
], ids=["generate", "convert", "convert-device-table", "trace-plot"])
def test_a_full_disk_names_the_trace_file_and_what_it_needs(argv, name, tmp_path, capsys, full_disk):
    trace()(tmp_path / "t.parquet", None)
    (tmp_path / "in.csv").write_text(ISO_CSV.replace(":00,", ":00+01:00,").replace(":00\n", ":00+01:00\n"))
    full_disk.add(name)
    assert main(argv.replace("{tmp}", str(tmp_path)).split()) == 2
    disk_full_line(capsys.readouterr().err, tmp_path / name)


def test_a_full_disk_stops_a_folder_with_the_fix_for_space(tmp_path, capsys, monkeypatch):
    import errno
    import os

    def mkdir(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (tmp_path / "c.toml").write_text(config().replace("{tmp}", str(tmp_path)))
    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert main(["run", str(tmp_path / "c.toml"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"error: cannot create the folder {tmp_path / 'runs'}: No space left on device; "
                                       "free some space, then run the command again\n")
