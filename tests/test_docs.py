"""The user's guide stays a guide: size, working links, every key and method documented."""

from __future__ import annotations

import re

from ssfl import reference
from ssfl.cli import build_parser
from ssfl.registry import METHODS
from tasks.config import DEFAULTS, flatten
from tasks.settings import keys_of
from tests.conftest import ROOT

README = ROOT / "README.md"


def test_readme_is_at_most_10_kb():
    assert len(README.read_bytes()) <= 10_240


def quickstart_transcript() -> list[str]:
    """The lines of the README's quickstart transcript (the block after its marker)."""
    text = README.read_text()
    match = re.search(r"<!-- quickstart-transcript -->\s*```\n(.*?)```", text, re.S)
    assert match, "README.md has no quickstart-transcript block"
    return match.group(1).splitlines()


def test_the_readmes_quickstart_transcript_has_the_shape_a_run_prints():
    """Its shape, not its digits (they differ between CPU kinds, as the README says): the
    header, a line per round in order, the summary whose final and best accuracy are the
    rounds' last and largest."""
    lines = [line for line in quickstart_transcript() if not line.startswith("Successfully ")]
    header, *rounds, summary = lines
    assert re.fullmatch(
        r"ssfl: fedseal on synthetic28 \(iid, R=0\.000\), 3 clients, 3 rounds -> runs/quickstart",
        header,
    )
    accuracies = []
    for k, line in enumerate(rounds, 1):
        end = "done" if k == 3 else r"(\d+m )?\d+s left"
        found = re.fullmatch(
            rf"round {k}/3  test_accuracy (0\.\d{{4}})  \d+\.\d s/round  {end}", line
        )
        assert found, line
        accuracies.append(found.group(1))
    assert len(accuracies) == 3
    found = re.fullmatch(
        r"final_test_accuracy (0\.\d{4})  best_test_accuracy (0\.\d{4})  "
        r"wall_seconds \d+\.\d  -> runs/quickstart/results\.json",
        summary,
    )
    assert found and found.groups() == (accuracies[-1], max(accuracies)), summary
    assert "differ between CPU kinds" in README.read_text()


def test_every_relative_link_of_the_docs_resolves():
    pages = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page) -> set[str]:
    """The anchors of a page's headings (lines in code blocks are no headings)."""
    found, in_code = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#+ ", line):
            found.add(slug(line.lstrip("#")))
    return found


def test_every_anchor_a_page_links_is_a_heading_of_its_target():
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        for path, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text()):
            target = (page.parent / path) if path else page
            if path.startswith(("http://", "https://")) or target.suffix != ".md":
                continue
            assert anchor in anchors(target), f"{page.name}: {path}#{anchor}"


def test_every_method_is_in_the_readme_and_every_key_in_the_reference():
    readme = README.read_text()
    assert all(f"`{name}`" in readme for name in METHODS)
    reference = (ROOT / "docs" / "reference.md").read_text()
    assert all(f"`{key}`" in reference for key in flatten(DEFAULTS) if key != "algo")


def test_the_reference_tables_are_those_the_declarations_generate():
    text = reference.DOC.read_text()
    assert reference.rendered(text) == text, "stale: run python -m ssfl.reference"
    assert reference.main(["--check"]) == 0


def test_the_generated_tables_hold_every_key_with_its_help_and_a_stale_file_fails(
    monkeypatch, tmp_path
):
    block = reference.block()
    for name, spec in METHODS.items():
        for key, f in keys_of(spec.settings_class(), "algo.").items():
            assert f"| `{key}` |" in block and f.metadata["help"] in block, (name, key)
    stale = tmp_path / "reference.md"
    stale.write_text(reference.DOC.read_text().replace("| `rounds` | `50` |", "| `rounds` | `5` |"))
    monkeypatch.setattr(reference, "DOC", stale)
    assert reference.main(["--check"]) == 1
    assert reference.main([]) == 0 and reference.main(["--check"]) == 0


def test_the_generated_commands_hold_every_option_of_every_subcommand():
    block = reference.cli_block()
    parser = build_parser()
    for name, (_, sub) in reference.subcommands(parser).items():
        assert f"### `ssfl {name}`" in block
        for action in sub._actions:
            for option in action.option_strings:
                assert option in ("-h", "--help") or f"`{option}`" in block, (name, option)
    for option in ("--rows", "--columns", "--overwrite", "--ray-address", "--version"):
        assert f"| `{option}`" in block


def test_a_stale_command_table_fails_the_check(monkeypatch, tmp_path):
    stale = tmp_path / "reference.md"
    stale.write_text(reference.DOC.read_text().replace("| `--ray-address` ", "| `--ray` "))
    monkeypatch.setattr(reference, "DOC", stale)
    assert reference.main(["--check"]) == 1


def test_the_default_experiment_is_the_same_everywhere():
    pyproject = (ROOT / "pyproject.toml").read_text()
    script = (ROOT / "scripts" / "run-default.sh").read_text()
    default = re.search(r'^experiment = "([^"]+)"', pyproject, re.M).group(1)
    assert f"ssfl run {default}" in script and (ROOT / default).is_file()


def test_the_references_experiments_table_names_every_folder_and_file():
    """Each experiments/ folder has a row naming each of its files (by stem), or a row
    saying its files are another folder's (``the rows of``/``the same cells``)."""
    text = (ROOT / "docs" / "reference.md").read_text()
    table = text[text.index("## Experiments") :].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines()[2:]:
        first, what = line.split("|")[1:3]
        for folder in re.findall(r"`(?:experiments/)?([\w.-]+)/?`", first):
            rows[folder] = what
    for path in sorted((ROOT / "experiments").iterdir()):
        assert path.name in rows, f"{path.name} has no row in reference.md's experiments table"
        if (
            path.is_dir()
            and "the rows of" not in rows[path.name]
            and "cells" not in rows[path.name]
        ):
            missing = [f.stem for f in path.glob("*.yaml") if f"`{f.stem}`" not in rows[path.name]]
            assert not missing, f"{path.name}: {missing} not named in its row"
