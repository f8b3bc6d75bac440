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


def case(name: str, argv: str, says: str, **files):
    """A bad input: `fedsim ARGV` (split on spaces) in a folder holding `files` (text, bytes,
    or a function(path, finished_run) writing it); `says`: a regex for its line."""
    return pytest.param(argv.split(), says, files, id=name)


def run_then_replace_trace(runs: Path, finished) -> None:
    """Run c.toml (which replays t.parquet), then write another trace over t.parquet."""
    assert main(["run", str(runs.parent / "c.toml"), "--quiet"]) == 0
    trace(end=[50.0, 90.0, 99.0])(runs.parent / "t.parquet", finished)


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


def swept(path: Path, run) -> None:
    """runs/ (`path`) holding the quadratic study t, swept from s.toml beside it."""
    tmp = path.parent
    (tmp / "s.toml").write_text(quadratic_study().replace("{tmp}", str(tmp)))
    assert main(["sweep", str(tmp / "s.toml"), "--quiet"]) == 0


def swept_then_replaced(*change: str):
    """runs/ holding study t, whose study.toml is then replaced by that of s.toml run with
    `change` (--set lines) as study u."""
    def write(path, run):
        swept(path, run)
        assert main(["sweep", str(path.parent / "s.toml"), "--quiet", "--set", "run.name=u", *change]) == 0
        shutil.copy(path / "u" / "study.toml", path / "t" / "study.toml")
    return write


def swept_then_unrecorded(path: Path, run) -> None:
    """runs/ holding study t without its study.toml (deleted, as a damaged one is)."""
    swept(path, run)
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


def png() -> bytes:
    """A 4 x 4 grey PNG."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (4, 4)).save(out, format="PNG")
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
    case("seed-beyond-64-bits", "run quickstart --set run.seed=99999999999999999999", r"is too large \(it must fit in 64 bits\)"),
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
    case("unknown-option", "run --bogus", r"fedsim: unrecognized arguments: --bogus; see `fedsim --help`"),
    case("no-command", "", r"the following arguments are required: command"),
    case("not-an-integer-argument", "trace generate always --devices x --days 1 --out {tmp}/t.parquet",
         r"fedsim trace generate: argument --devices: invalid int value: 'x'; see `fedsim trace generate --help`"),
    case("missing-config", "run {tmp}/nope.toml", r"config .*nope\.toml: no such file"),
    case("folder-as-config", "run {tmp}", r"config .*: cannot read it \(Is a directory\); pass a readable \.toml file"),
    case("resume-missing-folder", "run --resume {tmp}/nope", r"nope: no such run directory"),
    case("resume-and-config", "run quickstart --resume {tmp}/r", r"give a config or --resume RUN_DIR, not both"),
    case("resume-changes-lr", "run --resume {tmp}/r --set client.lr=1", r"client\.lr cannot be changed when resuming"),
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
    case("plot-missing-folder", "plot {tmp}/nope", r"nope: no such folder; pass a run directory"),
    case("report-missing-rounds", "report {tmp}/r", r"r: not a run directory \(no rounds\.parquet",
         r=run_dir(lambda path: (path / "rounds.parquet").unlink())),
    case("report-bad-target", "report {tmp}/r --target 1.5", r"1\.5", r=run_dir()),
    case("best-by-without-study", "report {tmp}/r --best-by final_acc --over client.lr", r"not a study folder \(no study\.toml\); --best-by and --over report on the folder of a study",
         r=run_dir()),
    case("plot-damaged-rounds", "plot {tmp}/r", r"rounds\.parquet: not a readable Parquet file",
         r=run_dir(lambda path: (path / "rounds.parquet").write_bytes(b"PAR1 broken"))),
    case("sweep-missing-study", "sweep {tmp}/nope.toml", r"nope\.toml: no such file"),
    case("sweep-name-axis", "sweep {tmp}/s.toml", r"\[sweep\] 'run\.name' cannot vary per point",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.name" = ["a", "b"]\n'}),
    case("sweep-algorithms-axis", "sweep {tmp}/s.toml", r"'run\.algorithms' cannot vary per point \(sweep \"algorithm\.name\"",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.algorithms" = [["fedavg"], ["mifa"]]\n'}),
    case("sweep-one-and-one-point-zero", "sweep {tmp}/s.toml", r"the point \{'algorithm\.name': 'fedavg', 'run\.seed': 1\.0\} comes twice \(1 and 1\.0 are one value\)",
         **{"s.toml": 'base = "quickstart"\n[sweep]\n"run.seed" = [1, 1.0]\n'}),
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
         r"^error: a local step of the run needs about 90\.1 TB of memory \(parameters, gradients and starts of 100 "
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
         r"^error: \S+s\.toml: every point: \[server\] mode = 'async' needs timing = 'model'",
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
    # --- outputs -----------------------------------------------------------------------------
    case("run-out-under-a-file", RUN, r"cannot create the folder (\S+)/blocker/runs: \1/blocker is a file; choose another \[run\] out", blocker="",
         **{"c.toml": config(run={"out": "{tmp}/blocker/runs"})}),
    case("generate-out-a-folder", "trace generate always --devices 3 --days 1 --out {tmp}", r"^error: --out \S+: is a folder; give the path"),
    case("generate-out-under-a-file", "trace generate always --devices 3 --days 1 --out {tmp}/blocker/t.parquet",
         r"cannot create the folder (\S+)/blocker: \1/blocker is a file", blocker=""),
    case("devices-out-a-folder", CONVERT + " --devices-out {tmp}", r"^error: --devices-out \S+: is a folder; give the path", **{"in.csv": "device_id,start,end\n0,0,10\n"}),
    case("plot-into-a-file", "plot {tmp}/r", r"cannot create the folder (\S+)/r/plots: \1/r/plots is a file", r=run_dir(lambda path: (path / "plots").write_text(""))),
    # --- run directories, checkpoints, files a command must not overwrite, your own module (issue 37) ---
    #
    #
    #
    # --- asynchronous runs: stop and resume (issue 37) ---
    #
    #
    #
    # --- unbounded work, memory, config refusals before loading (issue 37) ---
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
         r"'sweep\.run\.seed=\[0,1,2\]'`$", runs=swept),
    case("sweep-folder-changes-an-axis", "sweep {tmp}/runs/t --set sweep.algorithm.name=[\"fedavg\"]",
         r"a study's axes cannot change on --resume .*`fedsim sweep \S+/runs/t/study\.toml --set run\.name=t-2 "
         r"--set run\.out=\S+/runs --set 'sweep\.algorithm\.name=\[\"fedavg\"\]'`$", runs=swept),
    case("sweep-resume-changes-the-warm-start", "sweep --resume {tmp}/runs/t --set warm_start.client.lr=0.5",
         r"--set 'warm_start\.client\.lr=0\.5': a study's warm start cannot change on --resume", runs=swept),
    #
    #
    #
    # --- trace scale, events log (issue 37) ---
    #
    #
    #
    # --- audit of the surfaces since d478d11: modules, local epochs, FLASH, fedbuff, halfnormal, run format, trace info|plot RUN_DIR ---
    #
    #
    #
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
