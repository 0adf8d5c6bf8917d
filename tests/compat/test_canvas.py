"""Canvas primitives (chain, group, chord, chunks, map, starmap, links, immutable signatures) on plain
tasks and their keyed twins: the same results, and on keyed runs one task of the key at a time."""

from __future__ import annotations

from celery import chain, chord, group
from celery.result import AsyncResult

from testproject.celery import app
from testproject.compat.tasks import add, double, fail, on_error, tsum
from tests.compat.cases import MARKS, PLAIN, check_key, events, hold_key, kinds, starts
from tests.waiting import wait_until

pytestmark = MARKS


@kinds()
def test_chain_passes_each_result_on(kind, key, workers):
    hold_key(kind, key)
    result = chain(add(kind).s(1, 2, key=key), add(kind).s(3, key=key), add(kind).s(4, key=key))()
    assert result.get(timeout=10) == 10
    assert result.parent.get(timeout=1) == 6 and result.parent.parent.get(timeout=1) == 3
    check_key(kind, key, order=[result.parent.parent.id, result.parent.id, result.id])


@kinds()
def test_group_collects_results_in_order(kind, key, workers):
    hold_key(kind, key)
    result = group(add(kind).s(n, n, key=key, pause=0.05) for n in range(4))()
    assert result.get(timeout=10) == [0, 2, 4, 6]
    assert result.successful() and result.completed_count() == 4
    check_key(kind, key, order=[r.id for r in result.results])


@kinds()
def test_chord_calls_its_body_with_the_header_s_results(kind, key, workers):
    hold_key(kind, key)
    result = chord(add(kind).s(n, n, key=key) for n in range(3))(tsum(kind).s(key=key))
    assert result.get(timeout=10) == 6
    header = result.parent.results
    check_key(kind, key, order=[*(r.id for r in header), result.id])
    assert starts(key)[-1] == result.id, "the body runs after the whole header"


@kinds()
def test_chunks_split_the_calls_into_tasks(kind, key, workers):
    hold_key(kind, key, seconds=0.5)
    result = add(kind).chunks([(n, n, key, 0.5) for n in range(4)], 2).apply_async()
    assert result.get(timeout=10) == [[0, 2], [4, 6]]
    check_key(kind, key)  # the calls of one key run one at a time (a plain task's chunks run at once)


@kinds()
def test_map_calls_the_task_on_each_item(kind, key, workers):
    hold_key(kind, key, seconds=0.5)
    result = double(kind).map([{"key": key, "n": n} for n in range(4)]).delay()
    assert result.get(timeout=10) == [0, 2, 4, 6]
    check_key(kind, key)


@kinds()
def test_starmap_calls_the_task_on_each_argument_tuple(kind, key, workers):
    hold_key(kind, key, seconds=0.5)
    result = add(kind).starmap([(n, 1, key) for n in range(4)]).delay()
    assert result.get(timeout=10) == [1, 2, 3, 4]
    check_key(kind, key)


@kinds()
def test_link_calls_the_callback_with_the_result(kind, key, workers):
    hold_key(kind, key)
    callback_id = f"{key}-callback"
    parent = add(kind).apply_async((2, 2), {"key": key}, link=add(kind).s(10, key=key).set(task_id=callback_id))
    assert parent.get(timeout=10) == 4
    assert AsyncResult(callback_id, app=app).get(timeout=10) == 14
    check_key(kind, key, order=[parent.id, callback_id])


@kinds()
def test_link_error_calls_the_errback_with_the_request_and_exception(kind, key, workers):
    hold_key(kind, key)
    failed = fail(kind).apply_async(("broken on purpose",), {"key": key}, link_error=on_error(kind).s(key=key))
    assert isinstance(failed.get(timeout=10, propagate=False), ValueError)
    errback = wait_until(lambda: events(key, "errback"), 10, message="the errback")
    assert [(e["failed"], e["exc"]) for e in errback] == [(failed.id, "ValueError('broken on purpose')")]


@kinds()
def test_an_immutable_signature_ignores_the_parent_s_result(kind, key, workers):
    hold_key(kind, key)
    result = chain(add(kind).s(1, 2, key=key), add(kind).si(10, 20, key=key))()
    assert result.get(timeout=10) == 30
    check_key(kind, key, order=[result.parent.id, result.id])


@kinds(wait=False)
def test_a_chain_of_tasks_of_other_keys_runs_each_on_its_own(kind, key, workers):
    """The keys of a chain's tasks are their own: a step of another key does not wait for the first."""
    result = chain(add(kind).s(1, 2, key=f"{key}-a"), add(kind).s(3, key=f"{key}-b"))()
    assert result.get(timeout=10) == 6
    if kind != PLAIN:
        assert starts(f"{key}-a") == [result.parent.id] and starts(f"{key}-b") == [result.id]
