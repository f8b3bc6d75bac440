"""benchmarks/bench_loop_step.py: it checks that the three ways to a step agree before timing
them, writes its record, and refuses a model it cannot step in one line. No timed assertions:
its numbers are in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_loop_step.py"


def test_a_short_run_records_the_three_ways_of_each_model(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--models", "logreg,mlp", "--steps", "2", "--repeat", "1",
                           "--json", "out.json"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "out.json").read_text())
    assert [r["model"] for r in record["steps"]] == ["logreg", "mlp"] and record["batch"] == 16
    assert all(r[way] > 0 for r in record["steps"] for way in ("module", "autograd", "written out"))


def test_a_model_it_cannot_step_is_one_line_exit_2_and_nothing_written(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--models", "lenet5,resnet18-gn", "--json", "out.json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("error: --models: unknown name 'resnet18-gn'; choose from lenet5, cnn-fmnist, mlp, "
                           "logreg\n")
    assert not (tmp_path / "out.json").exists()
