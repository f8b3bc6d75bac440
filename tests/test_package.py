"""The package: distributed as fedsim-avail (`fedsim` on the package index is another project),
one version for the command, the metadata and the manifests, and a wheel that holds what the
quick start needs. .ci/run installs that wheel alone and runs the quick start from an empty
folder; here the wheel is built and read."""

from __future__ import annotations

import email
import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import pytest

import fedsim

ROOT = Path(__file__).resolve().parents[1]


def test_the_distribution_is_fedsim_avail_with_the_version_read_from_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["name"] == fedsim.DISTRIBUTION == "fedsim-avail"
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fedsim.__version__"}
    assert project["project"]["scripts"] == {"fedsim": "fedsim.cli:entry"}


def test_fedsim_version_prints_the_version_and_the_distribution(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedsim", "--version"], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"fedsim {fedsim.__version__} (fedsim-avail)\n"


def test_an_installed_fedsim_avail_has_the_packages_version():
    try:
        dist = importlib.metadata.distribution("fedsim-avail")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fedsim-avail is not installed here (a source checkout on PYTHONPATH)")
    origin = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if origin.startswith("file://") and Path(urlparse(origin).path).resolve() != ROOT:
        pytest.skip(f"the installed fedsim-avail comes from another checkout ({origin})")
    assert dist.version == fedsim.__version__


@pytest.mark.parametrize("page", ["README.md", "docs/install.md"])
def test_the_docs_say_which_distribution_to_install(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    assert "fedsim-avail" in text and "pip install fedsim-avail" in text


def test_the_wheel_holds_the_scenarios_the_command_and_the_metadata(tmp_path):
    pytest.importorskip("build")
    pytest.importorskip("setuptools")  # --no-isolation: the installed one, not a download
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                           "--outdir", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [wheel] = tmp_path.glob("*.whl")
    assert wheel.name == f"fedsim_avail-{fedsim.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"fedsim_avail-{fedsim.__version__}.dist-info"
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    scenarios = {p.name for p in (ROOT / "fedsim" / "scenarios").glob("*.toml")}
    assert "quickstart.toml" in scenarios
    assert {f"fedsim/scenarios/{name}" for name in scenarios} <= names
    assert {"fedsim/__init__.py", "fedsim/cli.py", "fedsim/__main__.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "benchmarks/"))]
    assert (metadata["Name"], metadata["Version"]) == ("fedsim-avail", fedsim.__version__)
    assert "fedsim = fedsim.cli:entry" in entry_points
