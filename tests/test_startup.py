"""Start-up: each command imports only the libraries it needs (a fresh interpreter per test,
since this test session has them all loaded already). Timings live in benchmarks/."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "matplotlib", "sklearn", "polars", "pyarrow", "tqdm", "torch._dynamo")
NOT_FOR_TRACES = {"torch", "matplotlib", "sklearn", "tqdm"}

CLI = """
import json, sys
import fedsim.cli
try:
    code = fedsim.cli.main({argv!r})
except SystemExit as exit:  # --help
    code = exit.code
print(json.dumps({{"code": code, "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def loaded_after(code: str, cwd=None) -> list:
    """Run `code` in a fresh Python; the last line it prints, parsed as JSON."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cli(argv: list[str], cwd=None) -> tuple[int, set]:
    """`fedsim ARGV` in a fresh Python: its exit code and the heavy libraries it imported."""
    out = loaded_after(CLI.format(argv=argv, heavy=HEAVY), cwd)
    return out["code"], set(out["loaded"])


def test_importing_the_cli_and_config_loads_no_heavy_library():
    loaded = loaded_after("import json, sys, fedsim, fedsim.cli, fedsim.config, fedsim.errors, "
                          "fedsim.files, fedsim.traces, fedsim.traces.commands\n"
                          f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert loaded == []


@pytest.mark.parametrize("argv", [["--help"], ["scenarios"], ["trace", "--help"],
                                  ["trace", "generate", "--help"], ["run", "--help"]])
def test_help_and_scenarios_load_no_heavy_library(argv):
    code, loaded = run_cli(argv)
    assert code == 0 and loaded == set()


def test_trace_commands_load_neither_torch_nor_matplotlib(tmp_path):
    trace = str(tmp_path / "t.parquet")
    code, loaded = run_cli(["trace", "generate", "markov", "--devices", "5", "--days", "1",
                            "--out", trace])
    assert code == 0 and not loaded & NOT_FOR_TRACES
    code, loaded = run_cli(["trace", "info", trace])
    assert code == 0 and not loaded & (NOT_FOR_TRACES | {"polars"})
    (tmp_path / "t.csv").write_text("device_id,start,end\n0,0,10\n1,5,20\n")
    code, loaded = run_cli(["trace", "convert", "--from", "csv", str(tmp_path / "t.csv"),
                            "--out", str(tmp_path / "c.parquet")])
    assert code == 0 and not loaded & NOT_FOR_TRACES
    code, loaded = run_cli(["trace", "plot", trace, "--out", str(tmp_path / "t.png")])
    assert code == 0 and not loaded & {"torch", "sklearn"} and "matplotlib" in loaded


def test_plot_loads_no_torch(tmp_path):
    import polars as pl

    (tmp_path / "r").mkdir()
    pl.DataFrame({"round": [0, 1], "t_end": [60.0, 120.0], "test_acc": [0.5, 0.6],
                  "test_loss": [1.0, 0.9]}).write_parquet(tmp_path / "r" / "rounds.parquet")
    pl.DataFrame({"arrivals": [2, 0]}).write_parquet(tmp_path / "r" / "devices.parquet")
    code, loaded = run_cli(["plot", str(tmp_path / "r")])
    assert code == 0 and not loaded & {"torch", "sklearn"}
    assert (tmp_path / "r" / "plots" / "accuracy_vs_rounds.png").is_file()


def test_public_api_loads_on_first_use():
    out = loaded_after(
        "import json, sys, fedsim\n"
        "names = [fedsim.__version__, fedsim.load_config, fedsim.FedsimError, fedsim.read_trace]\n"
        "before = 'torch' in sys.modules\n"
        "from fedsim.runs.comparison import run\nfrom fedsim.runs.experiment import RunResult\n"
        "same = fedsim.run is run and fedsim.RunResult is RunResult\n"
        "print(json.dumps([before, same, sorted(set(fedsim.__all__) - set(dir(fedsim)))]))")
    assert out == [False, True, []]
    import fedsim

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fedsim.nope  # noqa: B018


def test_a_digits_run_does_not_import_scikit_learn(tmp_path):
    code, loaded = run_cli(["run", "--quiet", "--set", "run.rounds=2", "--set", "run.eval_every=1",
                            "--set", f"run.out='{tmp_path}'"], cwd=tmp_path)
    assert code == 0 and "sklearn" not in loaded and "torch" in loaded
    assert "torch._dynamo" not in loaded  # torch's compiler stack: ~1 s that training never needs


TRAIN_EVERY_PATH = """
import json, sys
import numpy as np, torch
from fedsim.config import ClientConfig, DataConfig, ModelConfig
from fedsim.data.datasets import Dataset
from fedsim.training import build_trainer
from fedsim.training.task import classification_task
x = np.random.default_rng(0).integers(0, 256, size=(48, 1, 12, 12), dtype=np.uint8)
ds = Dataset("tiny", x, np.arange(48) % 10, x[:8], np.arange(8), 10, scale=1 / 255)
for model in ("logreg", "mlp", "cnn-svhn", "lstm"):
    task = classification_task(ds, DataConfig(clients=4), ModelConfig(name=model, hidden=8, dropout=0.0),
                               seed=0, device=torch.device("cpu"))
    for path in ("batched", "loop"):
        build_trainer(task, ClientConfig(batch_size=4, trainer=path), seed=0).train(
            0, np.arange(4), task.init_params()[None].repeat(4, 1), np.full(4, 2), 0.1)
print(json.dumps("torch._dynamo" in sys.modules))
"""


def test_training_never_imports_the_compiler_stack():
    """Both trainer paths of every model family compute gradients with plain autograd."""
    assert loaded_after(TRAIN_EVERY_PATH) is False


EDITABLE = """
import sys
from importlib.machinery import PathFinder
from importlib.util import spec_from_file_location

PACKAGE = {package!r}


class Editable:
    '''What `pip install -e` installs (setuptools' finder): asked after the path's own finder.'''

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "fedsim":
            return spec_from_file_location(name, PACKAGE + "/__init__.py")
        return PathFinder.find_spec(name, [PACKAGE]) if name.rpartition(".")[0] == "fedsim" else None


sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, Editable)
from fedsim.cli import entry
entry()
"""


@pytest.mark.parametrize("argv", [["--version"], ["trace", "info", "t.parquet"]])
def test_a_folder_named_fedsim_on_pythonpath_is_one_line_naming_it(tmp_path, argv):
    """A clone's parent on PYTHONPATH: its folder `fedsim` (the clone, no __init__.py) is
    imported as a namespace package before the editable install's finder is asked."""
    from pathlib import Path

    import fedsim

    (tmp_path / "fedsim").mkdir()
    package = str(Path(fedsim.__file__).parent)
    proc = subprocess.run([sys.executable, "-c", EDITABLE.format(package=package), *argv], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120, env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: the folder {tmp_path / 'fedsim'} is imported as the package fedsim, in place of "
                           f"fedsim's own ({package}): its parent {tmp_path} is on PYTHONPATH (or is the working "
                           f"directory); take {tmp_path} off PYTHONPATH, or start fedsim from another folder\n")
    (tmp_path / "elsewhere").mkdir()
    fixed = subprocess.run([sys.executable, "-c", EDITABLE.format(package=package), "--version"], capture_output=True,
                           text=True, cwd=tmp_path / "elsewhere", timeout=120, env={"PATH": ""})
    assert (fixed.returncode, fixed.stdout) == (0, f"fedsim {fedsim.__version__} (fedsim-avail)\n"), fixed.stderr


REFUSED = {  # a config refused for each kind of rule: the keys, a cross-key rule, a bound of the work
    "unknown key": "[server]\ndedline = 5\n",
    "deadline_sigma under ideal timing": "[server]\ntiming = 'ideal'\ndeadline_sigma = 5.0\n",
    "min_selected above the clients": "[data]\nclients = 10\n[server]\nmin_selected = 20\n",
    "update_frac with async": "[server]\nmode = 'async'\nupdate_frac = 0.5\n",
    "an algorithm's own key": "[algorithm]\nname = 'mifa'\nwarmup = 'yes'\n",
    "an algorithm's option out of its range": "[algorithm]\nname = 'fedprox'\nmu = -1.0\n",
    "an unknown model": "[model]\nname = 'lenet'\n",
    "local_epochs beyond any task": "[client]\nlocal_epochs = 1e9\n",
    "rounds beyond any run": "[run]\nrounds = 1000000000000\n",
}


@pytest.mark.parametrize("kind", REFUSED)
def test_a_refused_config_imports_no_torch_and_writes_nothing(kind, tmp_path):
    """Every rule that needs no data is checked before torch is imported or data is read."""
    (tmp_path / "c.toml").write_text(REFUSED[kind])
    code, loaded = run_cli(["run", "c.toml", "--quiet"], cwd=tmp_path)
    assert code == 2 and not loaded & {"torch", "matplotlib", "sklearn", "polars", "pyarrow"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_a_refused_study_imports_no_torch_and_writes_nothing(tmp_path):
    (tmp_path / "s.toml").write_text("[run]\nname = 's'\n[server]\ntiming = 'ideal'\ndeadline_sigma = 5.0\n"
                                     "[sweep]\n'run.seed' = [0, 1]\n")
    code, loaded = run_cli(["sweep", "s.toml", "--quiet"], cwd=tmp_path)
    assert code == 2 and not loaded & {"torch", "matplotlib", "sklearn"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]
