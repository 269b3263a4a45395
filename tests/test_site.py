"""The documentation site (mkdocs.yml, built by scripts/docs.sh in strict mode): no page of
docs/ is left out of its nav, and the nav names no page that does not exist."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def small_repo(root: Path, link: str) -> Path:
    """A repository with a README, one docs page linking to ``link`` and an experiment file;
    its mkdocs.yml is the project's with this nav and the project's hooks."""
    (root / "docs").mkdir(parents=True)
    (root / "experiments").mkdir()
    (root / "experiments" / "q.yaml").write_text("method: fedseal\n")
    (root / "README.md").write_text("# Home\n\nSee [the page](docs/page.md).\n")
    (root / "docs" / "page.md").write_text(f"# Page\n\nRun [this]({link}), [home](../README.md).\n")
    config = site_config()
    config.update(
        nav=[{"Home": HOME}, {"Page": "page.md"}],
        hooks=[str(ROOT / config["hooks"][0])],
        markdown_extensions=["tables", "toc"],
    )
    (root / "mkdocs.yml").write_text(yaml.safe_dump(config))
    return root / "mkdocs.yml"


@pytest.mark.slow
def test_links_outside_docs_are_served_from_the_site_and_a_missing_file_fails(tmp_path):
    pytest.importorskip("material", reason="the docs extra: bash scripts/docs.sh installs it")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    good = small_repo(tmp_path / "good", "../experiments/q.yaml")
    build(load_config(str(good), site_dir=str(tmp_path / "site")))
    page = (tmp_path / "site" / "page" / "index.html").read_text()
    assert 'href="../source/experiments/q.yaml"' in page and 'href="../"' in page
    assert (tmp_path / "site" / "source" / "experiments" / "q.yaml").read_text() == (
        "method: fedseal\n"
    )
    assert 'href="page/"' in (tmp_path / "site" / "index.html").read_text()
    bad = small_repo(tmp_path / "bad", "../experiments/missing.yaml")
    with pytest.raises(Abort, match="strict mode"):
        build(load_config(str(bad), site_dir=str(tmp_path / "site-bad")))
