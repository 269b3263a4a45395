"""The documentation site (mkdocs.yml, built by scripts/docs.sh in strict mode): no page of
docs/ is left out of its nav, and the nav names no page that does not exist."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import ROOT

HOME = "index.md"  # README.md, mounted by scripts/docs_hooks.py


class TaggedLoader(yaml.SafeLoader):
    """A safe loader that reads MkDocs' python tags (e.g. the toc's slugify) as null."""


TaggedLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)


def nav_pages(entries: list) -> list[str]:
    """Every page the nav lists, in order (its sections followed)."""
    pages: list[str] = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def site_config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=TaggedLoader)


def test_every_docs_page_is_in_the_nav_once_and_every_nav_page_exists():
    config = site_config()
    docs = ROOT / config["docs_dir"]
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page listed twice"
    on_disk = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    assert on_disk - set(listed) == set(), "pages of docs/ missing from mkdocs.yml's nav"
    assert set(listed) - on_disk == {HOME}, "nav pages that are not in docs/"
    assert listed[0] == HOME and not (docs / HOME).exists()


def test_the_site_is_strict_and_its_nav_follows_what_the_reader_wants_to_do():
    config = site_config()
    assert config["strict"] is True
    assert all(level == "warn" for level in config["validation"]["links"].values())
    sections = [next(iter(e)) for e in config["nav"] if isinstance(e, dict)]
    order = ["Home", "Tutorial", "How-to guides", "Explanations", "Reference", "Lab notebooks"]
    assert [s for s in order if s in sections] == sections
    assert (ROOT / config["hooks"][0]).is_file()


def test_ci_builds_the_site_strictly_with_the_pinned_docs_extra():
    script = (ROOT / "scripts" / "docs.sh").read_text()
    assert "mkdocs build --strict" in script and '"$OUT"' in script
    assert "bash scripts/docs.sh" in (ROOT / ".ci" / "run").read_text()
    assert Path(ROOT / "pyproject.toml").read_text().count("mkdocs==") == 1
