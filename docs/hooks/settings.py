"""MkDocs hook: the settings reference, generated from ``django_keyed_queue/conf.py``.

The marker ``<!-- settings table -->`` in a page becomes a table of every entry of
``DEFAULTS``: its setting name (``PREFIX`` + key), its default and its meaning, the comment
lines above the entry. conf.py is read with ``ast`` and ``tokenize``, never imported, so the
build needs no Django. A default that is an expression (``1024 * 1024``) shows its value and
its source after it.
"""

from __future__ import annotations

import ast
import io
import operator
import tokenize
from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = "<!-- settings table -->"
CONF = Path("django_keyed_queue") / "conf.py"
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow}


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    conf = Path(config.config_file_path).parent / CONF
    return markdown.replace(MARKER, table(conf.read_text(encoding="utf-8")))


def table(source: str) -> str:
    """The Markdown table of the settings that ``source`` (conf.py's text) defines."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for name, default, meaning in settings(source):
        rows.append(f"| `{name}` | {default} | {_cell(meaning)} |")
    return "\n".join(rows)


def settings(source: str) -> list[tuple[str, str, str]]:
    """(setting name, default as Markdown, comment) of each entry of ``DEFAULTS``, in order."""
    tree = ast.parse(source)
    prefix, defaults = _assigned(tree, "PREFIX"), _assigned(tree, "DEFAULTS")
    if not (isinstance(prefix, ast.Constant) and isinstance(prefix.value, str) and isinstance(defaults, ast.Dict)):
        raise PluginError(f"{CONF}: expected PREFIX = '...' and DEFAULTS = {{...}} at module level")
    comments = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and token.line.lstrip().startswith("#")
    }
    found = []
    for key, value in zip(defaults.keys, defaults.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            raise PluginError(f"{CONF}:{value.lineno}: a DEFAULTS key that is not a string")
        above, line = [], key.lineno - 1
        while line in comments:
            above.insert(0, comments[line])
            line -= 1
        if not above:
            raise PluginError(f"{CONF}:{key.lineno}: {key.value} has no comment saying what it means")
        found.append((prefix.value + key.value, _default(source, value), " ".join(above)))
    return found


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node.value
    return None


def _default(source: str, node: ast.expr) -> str:
    """The default as written; an expression also as its value, first."""
    written = ast.get_source_segment(source, node) or ""
    if isinstance(node, ast.Constant):
        return f"`{written}`"
    try:
        return f"`{_value(node)!r}` (`{written}`)"
    except (ValueError, TypeError):
        return f"`{written}`"


def _value(node: ast.expr):
    """A literal, or arithmetic on literals; anything else raises ValueError or TypeError."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    return ast.literal_eval(node)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
