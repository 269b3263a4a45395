"""MkDocs hooks of the documentation site (mkdocs.yml): the repository's README.md is the
home page, and a page's links to files outside docs/ (../experiments/x.yaml, ../README.md,
source files) point at copies of those files in the site's source/ folder, so that the
strict build checks them like any other link: a link to a missing file stays as written
and fails the build."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

MOUNT = "source"  # the site folder that holds the copies of files outside docs/
# An inline markdown link or image: ](target) or ](target#anchor), the target without spaces.
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:|^/|^#", re.IGNORECASE)


def docs_dir(config: MkDocsConfig) -> Path:
    return Path(config["docs_dir"]).resolve()


def repo(config: MkDocsConfig) -> Path:
    """The repository: the folder of mkdocs.yml."""
    return Path(config.config_file_path).resolve().parent


def home(config: MkDocsConfig) -> Path:
    """The repository's README.md, the site's home page."""
    return repo(config) / "README.md"


def site_uri(path: Path, config: MkDocsConfig) -> str | None:
    """Where the repository file ``path`` is in the site (None: outside the repository)."""
    if path == home(config):
        return "index.md"
    if path.is_relative_to(docs_dir(config)):
        return path.relative_to(docs_dir(config)).as_posix()
    if path.is_relative_to(repo(config)):
        return f"{MOUNT}/{path.relative_to(repo(config)).as_posix()}"
    return None


def origin(file: File, config: MkDocsConfig) -> Path:
    """The repository file a site file was made from."""
    if file.src_uri == "index.md" and file.generated_by:
        return home(config)
    if file.src_uri.startswith(f"{MOUNT}/") and file.generated_by:
        return repo(config) / file.src_uri.removeprefix(f"{MOUNT}/")
    return docs_dir(config) / file.src_uri


def targets(page: Path) -> list[Path]:
    """The repository files the page's relative links point at (existing or not)."""
    text = page.read_text(encoding="utf-8")
    found = [m.group(2) for m in LINK.finditer(text) if not EXTERNAL.match(m.group(2))]
    return [Path(posixpath.normpath((page.parent / t).as_posix())) for t in found]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add README.md as index.md and a copy of every existing file outside docs/ that a page
    links to (followed through the copied pages' own links)."""
    files.append(File.generated(config, "index.md", abs_src_path=str(home(config))))
    pending = [origin(f, config) for f in files.documentation_pages()]
    while pending:
        for target in targets(pending.pop()):
            uri = site_uri(target, config)
            if uri is None or not target.is_file() or files.get_file_from_path(uri):
                continue
            files.append(File.generated(config, uri, abs_src_path=str(target)))
            if target.suffix == ".md":
                pending.append(target)
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite each relative link to where its target is in the site, relative to the page."""
    here = origin(page.file, config)
    folder = posixpath.dirname(page.file.src_uri)

    def moved(match: re.Match) -> str:
        target = match.group(2)
        if EXTERNAL.match(target):
            return match.group(0)
        uri = site_uri(Path(posixpath.normpath((here.parent / target).as_posix())), config)
        if uri is None or not files.get_file_from_path(uri):
            return match.group(0)  # left for MkDocs to report: a missing file fails the build
        return f"{match.group(1)}{posixpath.relpath(uri, folder or '.')}{match.group(3)}"

    return LINK.sub(moved, markdown)
