"""The public names of ``django_keyed_queue``: each one loads, and the names type checkers read (the
``TYPE_CHECKING`` re-exports) are the ones the package loads at run time (``_LAZY``), from the same modules."""

import ast
import inspect

import django_keyed_queue


def _typed_names() -> dict[str, str]:
    tree = ast.parse(inspect.getsource(django_keyed_queue))
    [block] = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    return {alias.asname: "." * n.level + n.module for n in block.body for alias in n.names}


def test_the_type_checkers_names_are_the_ones_loaded_at_run_time():
    assert _typed_names() == django_keyed_queue._LAZY


def test_each_public_name_loads_and_an_unknown_one_is_refused_naming_it():
    for name in django_keyed_queue._LAZY:
        assert callable(getattr(django_keyed_queue, name)), name
    try:
        django_keyed_queue.get_gate  # noqa: B018  # an internal, not a public name
    except AttributeError as refused:
        assert "get_gate" in str(refused)
    else:
        raise AssertionError("get_gate is not a public name")
