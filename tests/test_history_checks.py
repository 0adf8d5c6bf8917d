"""The shared history checks against their definition, written the plain way (testproject/history_checks.py)."""

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from testproject.history_checks import check_serial


def by_definition(events, limit, accepted):
    """Each first start against every task accepted before it: slow (cubic in a key's tasks), plainly right."""
    problems, running, first_starts = [], defaultdict(dict), defaultdict(list)
    for e in events:
        key, task = e["key"], e["n"]
        if e["event"] == "end":
            running[key].pop(task, None)
            continue
        running[key][task] = None
        if len(running[key]) > limit:
            problems.append(f"key {key}: {list(running[key])} ran at once")
        started = first_starts[key]
        if task not in started:
            started.append(task)
            order = (accepted or {}).get(key) or range(task)
            before = order[: order.index(task)] if task in order else order
            skipped = [m for m in before if m not in started]
            if len(skipped) > limit - 1:
                problems.append(f"key {key}: {task} started before {skipped}")
    return dict(first_starts), problems


events = st.lists(
    st.fixed_dictionaries(
        {"event": st.sampled_from(["start", "end"]), "key": st.sampled_from("ab"), "n": st.integers(0, 8)}
    ),
    max_size=40,
)
orders = st.none() | st.fixed_dictionaries({"a": st.lists(st.integers(0, 8), max_size=10)})


@settings(max_examples=300, deadline=None)
@given(events, st.integers(1, 3), orders)
def test_check_serial_finds_what_the_definition_finds(history, limit, accepted):
    found = check_serial(history, limit, accepted)
    assert (found.first_starts, found.problems) == by_definition(history, limit, accepted)


def test_a_long_key_is_checked_in_one_pass():
    history = [{"event": event, "key": "k", "n": n} for n in range(20_000) for event in ("start", "end")]
    history[2 * 5000], history[2 * 5001] = history[2 * 5001], history[2 * 5000]  # 5001 starts before 5000
    history[2 * 5000 + 1], history[2 * 5001 + 1] = history[2 * 5001 + 1], history[2 * 5000 + 1]
    assert check_serial(history).problems == ["key k: 5001 started before [5000]"]
