"""The user's guide stays a guide: size, working links, every key and method documented."""

from __future__ import annotations

import re

from ssfl.registry import METHODS
from tasks.config import DEFAULTS, flatten
from tests.conftest import ROOT

README = ROOT / "README.md"


def test_readme_is_at_most_15_kb():
    assert len(README.read_bytes()) <= 15_000


def test_every_relative_link_of_the_docs_resolves():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_every_method_is_in_the_readme_and_every_key_in_the_reference():
    readme = README.read_text()
    assert all(f"`{name}`" in readme for name in METHODS)
    reference = (ROOT / "docs" / "reference.md").read_text()
    assert all(f"`{key}`" in reference for key in flatten(DEFAULTS) if key != "algo")


def test_the_default_experiment_is_the_same_everywhere():
    pyproject = (ROOT / "pyproject.toml").read_text()
    script = (ROOT / "scripts" / "run-default.sh").read_text()
    default = re.search(r'^experiment = "([^"]+)"', pyproject, re.M).group(1)
    assert f"ssfl run {default}" in script and (ROOT / default).is_file()
