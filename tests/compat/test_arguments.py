"""Calls: arguments as Celery checks and encodes them (``typing``, ``pydantic=True``, the serializer),
and a direct call, on plain tasks and their keyed twins."""

from __future__ import annotations

import pytest
from kombu.exceptions import EncodeError

from django_keyed_queue import InvalidArguments
from testproject.compat import tasks
from testproject.compat.tasks import add, request_fields, untyped
from tests.compat.cases import MARKS, PLAIN, hold_key, kinds, starts

pytestmark = MARKS


@kinds()
def test_typing_false_leaves_missing_arguments_to_fail_in_the_worker(kind, key, workers):
    hold_key(kind, key)
    result = untyped(kind).delay(1, key=key)  # y is missing: Celery does not check
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'y'"):
        result.get(timeout=10)
    assert result.state == "FAILURE"


@kinds(wait=False)
def test_missing_arguments_raise_type_error_at_the_call(kind, key, workers):
    with pytest.raises(TypeError, match="y"):
        add(kind).delay(1, key=key)
    assert starts(key) == []


@kinds(wait=False)
def test_arguments_the_serializer_cannot_encode_raise_encode_error_at_the_call(kind, key, workers):
    with pytest.raises(EncodeError) as raised:
        add(kind).delay(object(), 1, key=key)
    if kind != PLAIN:  # also the keyed queue's own error for bad input
        assert isinstance(raised.value, InvalidArguments)


@pytest.mark.skipif(not hasattr(tasks, "greet"), reason="pydantic is not installed")
@kinds()
def test_a_pydantic_task_takes_a_model_instance(kind, key, workers):
    """Celery 5.5+: the model is dumped at the call, validated back into a model in the worker, and the
    returned model is dumped into the result."""
    hold_key(kind, key)
    result = tasks.greet(kind).delay(tasks.Person(name="Ann"), key=key)
    assert result.get(timeout=10) == {"text": "hello Ann"}


@kinds(wait=False)
def test_a_direct_call_runs_the_task_here_with_its_request(kind, key):
    """``task(...)`` runs the function in the caller's process, as map, starmap and chunks do in the worker."""
    fields = request_fields(kind)(["called_directly", "args", "kwargs"], key=key)
    assert fields == {"called_directly": True, "args": (["called_directly", "args", "kwargs"],), "kwargs": {"key": key}}
