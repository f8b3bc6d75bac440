"""The documentation is self-contained: every relative link resolves inside the repository,
nothing points outside it (``../shared``), and every algorithm, generator and converter that
fedsim registers is documented. The short README holds the two quick-start commands that CI
runs; the pages under docs/ are a MkDocs site whose navigation lists every page, and which
builds with ``mkdocs build --strict`` (a broken link or anchor fails) where mkdocs is installed."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "traces" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "benchmarks").glob("*.md"))
    return [f for f in files if f.is_file()]


FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:, ...


def link_targets(text: str) -> list[str]:
    """Targets of inline and reference links outside code blocks and code spans."""
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    return LINK.findall(text) + REFERENCE.findall(text)


PAGES = ["index", "install", "quickstart", "running", "report", "plots", "tracking", "studies",
         "algorithms", "traces", "timing", "training", "datasets", "extending", "python-api",
         "reference", "reproductions", "benchmarks", "development"]


def test_the_documentation_files_exist():
    names = {f.relative_to(ROOT).as_posix() for f in markdown_files()}
    assert {"README.md", *(f"docs/{page}.md" for page in PAGES)} <= names


def test_the_site_navigation_lists_every_page_once():
    nav = re.findall(r"^\s+- (?:[^:\n]+: )?(\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages and len(set(nav)) == len(nav)
    assert set(PAGES) == {name.removesuffix(".md") for name in nav}


def test_the_readme_is_short_and_its_quick_start_is_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 120, "the README is the short page; details go to docs/"
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["pip install -e . && fedsim run",
                        "pip install -e '.[test]' && python -m pytest"]
    assert "-e '.[test]' && python3 -m pytest" in (ROOT / ".ci" / "run").read_text()
    for page in PAGES[1:]:  # "read on": every page of the site, as a link GitHub follows
        assert f"(docs/{page}.md)" in readme, page


SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::(\w+))?"$', re.M)


def test_every_included_file_and_section_exists():
    included = [(page, *m) for page in (ROOT / "docs").glob("*.md")
                for m in SNIPPET.findall(page.read_text(encoding="utf-8"))]
    assert {"benchmarks/RESULTS.md", "traces/README.md"} <= {path for _, path, _ in included}
    for page, path, section in included:
        text = (ROOT / path).read_text(encoding="utf-8")
        if section:
            assert f"--8<-- [start:{section}]" in text and f"--8<-- [end:{section}]" in text, (page, path)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
def test_the_site_builds_strictly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "index.html").read_text(encoding="utf-8")
    for name in ["fedsim.algorithms.base.Strategy.aggregate", "fedsim.runs.callbacks.Callback.on_round",
                 "fedsim.training.models.Model", "fedsim.traces.generators.GeneratorSpec",
                 "fedsim.traces.schema.Trace.from_intervals"]:
        assert f'id="{name}"' in reference, f"the API reference lacks {name}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_files_in_the_repository(path):
    broken = []
    for target in link_targets(path.read_text(encoding="utf-8")):
        if SCHEME.match(target):
            continue
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        if not file_part:  # an anchor in the same file
            continue
        resolved = (path.parent / file_part).resolve()
        if not resolved.exists() or not resolved.is_relative_to(ROOT):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files {broken}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_reference_to_files_outside_the_repository(path):
    text = path.read_text(encoding="utf-8")
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if "../shared" in line]
    assert not lines, f"{path.relative_to(ROOT)} mentions ../shared on lines {lines}"


def test_link_extraction_skips_code_and_reads_both_link_forms():
    text = ("see [a](docs/a.md#x) and ![img](p.png \"title\")\n"
            "`[not](code.md)`\n```\n[nor](fenced.md)\n```\n[ref]: other.md\n")
    assert link_targets(text) == ["docs/a.md#x", "p.png", "other.md"]


def test_every_registered_algorithm_generator_and_converter_is_documented():
    from fedsim.config.catalog import ALGORITHMS, CONVERTERS, GENERATORS

    algorithms = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")
    traces = (ROOT / "docs" / "traces.md").read_text(encoding="utf-8")
    missing = [name for name in ALGORITHMS if f"### `{name}`" not in algorithms]
    missing += [name for name in [*GENERATORS, *CONVERTERS] if f"### `{name}`" not in traces]
    assert not missing, f"no section in docs/ for {missing}"


FAST = {"run": ["--quiet", "--set", "run.rounds=3", "--set", "run.plots=false"],  # a short clock
        "sweep": ["--quiet", "--set", "run.rounds=3", "--set", "run.plots=false",
                  "--set", "sweep.run.seed=[0]"]}


def example_commands(page: str) -> tuple[list[list[str]], str]:
    """The `fedsim ...` lines of a page's bash blocks after the quick start (comments
    dropped), and its first TOML block (the study)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)[1:]
    commands = [shlex.split(line.split(" #")[0]) for block in blocks for line in block.splitlines()
                if line.startswith("fedsim ")]
    return commands, re.search(r"```toml\n(.*?)```", text, re.S).group(1)


def test_the_readme_examples_are_those_of_the_quick_start_page():
    readme, quickstart = example_commands("README.md"), example_commands("docs/quickstart.md")
    assert all(command in quickstart[0] for command in readme[0])
    assert tomllib.loads(readme[1]) == tomllib.loads(quickstart[1])


def test_the_quick_start_examples_run_as_printed(tmp_path, monkeypatch, capsys):
    """Each example command of the quick start page (the README's among them), in an empty
    folder: the trace replay, the report's wall-clock answers, the study and its summary."""
    from fedsim.cli import main

    commands, study = example_commands("docs/quickstart.md")
    assert [c[1] for c in commands] == ["trace", "trace", "run", "report", "sweep", "report"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.toml").write_text(study)
    outputs = []
    for command in commands:
        capsys.readouterr()
        assert main(command[1:] + FAST.get(command[1], [])) == 0, command
        outputs.append(capsys.readouterr().out)
    assert "time to target" in outputs[3] and "80% time" in outputs[3]
    assert "seeds" in outputs[5] and (tmp_path / "runs" / "seeds" / "summary.parquet").exists()
