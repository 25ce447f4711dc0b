"""MkDocs hook: pages from outside ``docs/`` and links written against the repository.

The documentation is read in two places: on the site and as Markdown files in a checkout.
Its files link to each other relatively (``../BENCHMARKS.md``, ``../bench/vs_trl.py``), which
is right in a checkout; on the site:

* files of the repository that are site pages without living under ``docs/``
  (:data:`EXTRA_PAGES`, e.g. ``BENCHMARKS.md``) are added to the build as they are, and a link to
  one points to its page;
* a link from such a page into ``docs/`` is rewritten relative to where the page sits on the site;
* a link to any other file that exists in the repository (a script, a source file) becomes the
  file's path in code type, since the site does not serve source files;
* a link to nothing is left alone, so that ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

#: repository file -> its page on the site (the file's text is not changed)
EXTRA_PAGES: dict[str, str] = {"BENCHMARKS.md": "benchmarks.md"}

# an inline link or image: [text](target "optional title"); the target has no spaces
_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)", re.MULTILINE)
_EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#|/)")

_state: dict[str, Path] = {}


def on_config(config: Any) -> Any:
    _state["root"] = Path(config.config_file_path).resolve().parent
    _state["docs"] = Path(config.docs_dir).resolve()
    return config


def on_files(files: Files, config: Any) -> Files:
    root = _state["root"]
    for source, uri in EXTRA_PAGES.items():
        path = root / source
        if not path.is_file():
            raise FileNotFoundError(f"mkdocs_hooks/repo_links.py: {path} (a site page) is missing")
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    source = page.file.abs_src_path
    if not source:  # a page generated from code links only to pages of the site
        return markdown
    return rewrite_links(markdown, Path(source).resolve(), page.file.src_uri)


def rewrite_links(markdown: str, source: Path, src_uri: str) -> str:
    """``markdown`` of the repository file ``source`` (the page ``src_uri`` of the site) with
    its links pointing where they should on the site; fenced code blocks are left as they are."""
    out, pos, fence = [], 0, None
    for match in _FENCE.finditer(markdown):
        if fence is None:
            out.append(_rewrite_text(markdown[pos:match.start()], source, src_uri))
            pos, fence = match.start(), match.group("fence")
        elif match.group("fence").startswith(fence):
            out.append(markdown[pos:match.end()])
            pos, fence = match.end(), None
    tail = markdown[pos:]
    out.append(tail if fence is not None else _rewrite_text(tail, source, src_uri))
    return "".join(out)


def _rewrite_text(text: str, source: Path, src_uri: str) -> str:
    return _LINK.sub(lambda m: _rewrite_link(m, source, src_uri), text)


def _rewrite_link(match: re.Match[str], source: Path, src_uri: str) -> str:
    target = match.group("target")
    if _EXTERNAL.match(target):
        return match.group(0)
    path, _, anchor = target.partition("#")
    resolved = (source.parent / path).resolve()
    root, docs = _state["root"], _state["docs"]
    pages = {(root / src).resolve(): uri for src, uri in EXTRA_PAGES.items()}
    if resolved in pages:
        site_uri = pages[resolved]
    elif resolved.is_relative_to(docs):
        site_uri = resolved.relative_to(docs).as_posix()
    elif resolved.is_relative_to(root) and resolved.exists():
        shown = resolved.relative_to(root).as_posix()
        text = match.group("text")
        return text if shown in text else f"{text} (`{shown}`)"
    else:  # nothing there: mkdocs reports it (and --strict fails)
        return match.group(0)
    relative = os.path.relpath(site_uri, os.path.dirname(src_uri) or ".")
    new_target = Path(relative).as_posix() + (f"#{anchor}" if anchor else "")
    return f"{match.group('bang')}[{match.group('text')}]({new_target}{match.group('title') or ''})"
