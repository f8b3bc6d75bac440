"""The documentation is self-contained: every relative link resolves inside the repository,
nothing points outside it (``../shared``), and every algorithm, generator and converter that
fedsim registers is documented."""

from __future__ import annotations

import re
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


def test_the_documentation_files_exist():
    names = {f.relative_to(ROOT).as_posix() for f in markdown_files()}
    assert {"README.md", "docs/algorithms.md", "docs/traces.md", "docs/datasets.md"} <= names


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
