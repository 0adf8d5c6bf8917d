"""Every attempt's error on the record: what a retry's message carries is read only as text, cut to size."""

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from django_keyed_queue.worker.attempt_errors import (
    ERROR_CHARS,
    ERRORS_HEADER,
    KEPT_ERRORS,
    carried,
    earlier_errors,
    with_earlier,
)


def request_with(value) -> SimpleNamespace:
    return SimpleNamespace(**{ERRORS_HEADER: value})


def test_the_record_shows_this_attempts_error_then_the_earlier_ones_newest_first():
    earlier = carried(carried([], 1, "ValueError: one"), 2, "ValueError: two")
    assert earlier == ["attempt 1: ValueError: one", "attempt 2: ValueError: two"]
    assert with_earlier("ValueError: three", earlier) == (
        "ValueError: three\n\nEarlier attempts:\n\nattempt 2: ValueError: two\n\nattempt 1: ValueError: one"
    )
    assert with_earlier("", earlier).startswith("Earlier attempts:\n\nattempt 2"), "a success keeps them too"
    assert with_earlier("ValueError: only", []) == "ValueError: only", "a first attempt reads as before"


def test_only_the_latest_attempts_are_kept_each_cut_to_size():
    errors: list[str] = []
    for attempt in range(1, 30):
        errors = carried(errors, attempt, "x" * 5000)
    assert len(errors) == KEPT_ERRORS and errors[-1].startswith("attempt 29: ")
    assert {len(e) for e in errors} == {ERROR_CHARS}


@given(
    st.one_of(
        st.none(),
        st.text(),
        st.integers(),
        st.dictionaries(st.text(), st.text()),
        st.lists(st.one_of(st.text(), st.integers(), st.none(), st.lists(st.text())), max_size=40),
    )
)
def test_a_header_written_by_anyone_is_read_only_as_a_few_texts(value):
    read = earlier_errors(request_with(value))
    assert isinstance(read, list) and len(read) <= KEPT_ERRORS
    assert all(isinstance(e, str) and len(e) <= ERROR_CHARS for e in read)
    assert earlier_errors(SimpleNamespace()) == []
