"""MkDocs hook: the home page and the quickstart are README.md's sections, read at build time.

The README is the one source of the install steps. ``docs/index.md`` and ``docs/quickstart.md``
hold a marker comment that this hook replaces with README sections:

- ``<!-- README: home -->``: the introduction and every ``##`` section before the install one;
- ``<!-- README: quickstart -->``: the install section (its title starts with "Install") and
  every ``##`` section after it, except those the site has pages of its own for
  (``SECTIONS_ELSEWHERE``).

Links are rewritten for the site: ``docs/x.md`` becomes ``x.md``; a link to another file of
the repository becomes a link to it under ``repo_url`` if the site has one, else its path in a
code span; ``#anchor`` links into a section on the other page, or on a page of its own, follow it.
A link that reads as its target's path reads as the target page's title instead.
A README without an install section fails the build.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from markdown.extensions.toc import slugify
from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- README: (home|quickstart) -->$", re.MULTILINE)
#: README sections left out of the quickstart, with the site page that covers each (None: the nav).
SECTIONS_ELSEWHERE = {"Settings": "settings.md", "Documentation": None}
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
#: A link or image (its text may hold code spans), or else a code span, left as it is.
_LINK_OR_CODE = re.compile(r"(!?\[(?:[^\]`]|`[^`]*`)*\])\(([^)\s]+)\)|`+[^`]*`+")


def on_page_markdown(markdown, page, config, files):
    if not MARKER.search(markdown):
        return markdown
    readme = Path(config.config_file_path).parent / "README.md"
    pages = _split(readme.read_text(encoding="utf-8"))
    titles = dict(_nav_pages(config.nav or []))
    return MARKER.sub(lambda match: _for_site(pages, match.group(1), config.repo_url, titles), markdown)


def _nav_pages(nav):
    """(page, title) of each page of the nav."""
    for item in nav:
        if isinstance(item, dict):
            for title, value in item.items():
                yield from [(value, title)] if isinstance(value, str) else _nav_pages(value)


def _split(text: str) -> dict[str, list[tuple[str, str]]]:
    """The README's ``##`` sections as (title, text), in order, divided into the two pages."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line, in_code in _lines(text):
        if not in_code and line.startswith("## "):
            sections.append((line[3:].strip(), []))
        sections[-1][1].append(line)
    titles = [title for title, _ in sections]
    install = next((i for i, title in enumerate(titles) if title.startswith("Install")), None)
    if install is None:
        raise PluginError(f"README.md has no '## Install ...' section to make the quickstart of (sections: {titles})")
    whole = [(title, "\n".join(lines).strip("\n")) for title, lines in sections]
    return {
        "home": whole[:install],
        "quickstart": [(t, body) for t, body in whole[install:] if t not in SECTIONS_ELSEWHERE],
        "elsewhere": [(t, body) for t, body in whole[install:] if t in SECTIONS_ELSEWHERE],
    }


def _for_site(pages: dict[str, list[tuple[str, str]]], name: str, repo_url: str | None, titles: dict) -> str:
    """One page's README sections, with their links made to work on the site.

    A link whose text is its target's path (``[docs/x.md](docs/x.md)``) reads the page's title.
    """
    anchors = {page: _anchors(pages[part]) for page, part in (("index.md", "home"), ("quickstart.md", "quickstart"))}
    here = "index.md" if name == "home" else "quickstart.md"
    elsewhere = {slugify(title, "-"): SECTIONS_ELSEWHERE[title] or "index.md" for title, _ in pages["elsewhere"]}

    def target(url: str) -> str | None:
        if re.match(r"^[a-z][a-z0-9+.-]*:", url, re.IGNORECASE):
            return url  # http:, mailto: ...
        if url.startswith("#"):
            anchor = url[1:]
            if anchor in anchors[here]:
                return url
            for page, names in anchors.items():
                if anchor in names:
                    return page + url
            return elsewhere.get(anchor, url)  # an unknown anchor is left for strict mode to report
        if url.startswith("docs/"):
            return url[len("docs/") :]
        if repo_url:
            return f"{repo_url.rstrip('/')}/blob/main/{url.removeprefix('./')}"
        return None

    def link(match: re.Match) -> str:
        label, url = match.group(1), match.group(2)
        if label is None:
            return match.group(0)  # a code span
        new = target(url)
        text, path = label.lstrip("!")[1:-1], url.split("#", 1)[0]
        if new is not None:
            page = new.split("#", 1)[0]
            if text.strip("`") == path and page in titles and not label.startswith("!"):
                label = f"[{titles[page]}]"
            return f"{label}({new})"
        return f"`{path}`" if text.strip("`") == path else f"{text} (`{path}`)"

    text = "\n\n".join(body for _, body in pages[name])
    blocks = itertools.groupby(_lines(text), key=lambda pair: pair[1])  # prose and code, by turns
    return "\n".join(
        "\n".join(line for line, _ in block)
        if in_code
        else _LINK_OR_CODE.sub(link, "\n".join(line for line, _ in block))
        for in_code, block in blocks
    )


def _anchors(sections: list[tuple[str, str]]) -> set[str]:
    """The ids the site gives the headings of these sections."""
    headings = (
        re.match(r"^#{1,6} (.+?)\s*#*$", line) for _, body in sections for line, code in _lines(body) if not code
    )
    return {slugify(heading.group(1), "-") for heading in headings if heading}


def _lines(text: str):
    """Each line of ``text`` with whether it belongs to a fenced code block (its fences included)."""
    fence = ""
    for line in text.split("\n"):
        marks = _FENCE.match(line)
        if fence:
            if marks and marks.group(1)[0] == fence[0] and len(marks.group(1)) >= len(fence) and not line.strip(" `~"):
                fence = ""
            yield line, True
        elif marks:
            fence = marks.group(1)
            yield line, True
        else:
            yield line, False
