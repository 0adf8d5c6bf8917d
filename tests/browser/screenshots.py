"""Pictures of the admin for the docs (``KEYED_QUEUE_DOCS_SCREENSHOTS=1``), taken by the browser tier."""

from pathlib import Path

#: Where pictures for the docs go, when a run is asked for them.
DOCS_DIR = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def save_for_docs(page, path: Path, height: int | None) -> None:
    """The page down to the end of its content or to ``height``, in 256 colours: under 150 KB."""
    from PIL import Image  # only here: a normal run does not need Pillow

    bottom = page.evaluate("Math.ceil(document.querySelector('#content').getBoundingClientRect().bottom + scrollY)")
    clip = {"x": 0, "y": 0, "width": page.viewport_size["width"], "height": min(bottom + 16, height or bottom + 16)}
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True, clip=clip)
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)
