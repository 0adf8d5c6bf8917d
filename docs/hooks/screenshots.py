"""MkDocs hook: the images under ``docs/screenshots/`` shown where a page has ``<!-- screenshots -->``.

The marker becomes a "Screenshots" section with one captioned figure per image, in file name
order; the caption is the file name without its extension, dashes and underscores read as
spaces (``task-list-1280.png``: "Task list 1280"). An image the page already links itself is
not shown twice. With no images the marker becomes nothing.
"""

from __future__ import annotations

from pathlib import Path

MARKER = "<!-- screenshots -->"
FOLDER = "screenshots"
IMAGES = {".png", ".jpg", ".jpeg", ".webp", ".svg", ".gif"}


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    folder = Path(config.docs_dir) / FOLDER
    names = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in IMAGES) if folder.is_dir() else []
    up = "../" * page.file.src_uri.count("/")  # from the page's folder to docs/
    shown = [name for name in names if f"{FOLDER}/{name}" not in markdown]
    if not shown:
        return markdown.replace(MARKER, "")
    figures = [_figure(f"{up}{FOLDER}/{name}", _caption(name)) for name in shown]
    return markdown.replace(MARKER, "## Screenshots\n\n" + "\n\n".join(figures))


def _caption(name: str) -> str:
    words = Path(name).stem.replace("_", " ").replace("-", " ").strip()
    return words[:1].upper() + words[1:]


def _figure(src: str, caption: str) -> str:
    return f'<figure markdown="span">\n  ![{caption}]({src}) <figcaption>{caption}</figcaption>\n</figure>'
