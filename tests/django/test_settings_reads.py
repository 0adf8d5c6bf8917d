"""Each ``KEYED_QUEUE_*`` setting is read from Django once and kept until Django says one changed."""

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from django_keyed_queue.conf import settings as keyed


def test_a_setting_is_read_again_once_django_says_it_changed():
    before = keyed.LEASE_SECONDS
    with override_settings(KEYED_QUEUE_LEASE_SECONDS=before + 7.5):
        assert keyed.LEASE_SECONDS == before + 7.5
    assert keyed.LEASE_SECONDS == before


def test_pytest_djangos_settings_fixture_is_seen(settings):
    settings.KEYED_QUEUE_MAX_WAITING = 12
    assert keyed.MAX_WAITING == 12
    settings.KEYED_QUEUE_MAX_WAITING = 13
    assert keyed.MAX_WAITING == 13


def test_a_read_is_kept_until_a_change_is_signalled():
    """Kept, not read each time: a value written behind Django's back is not seen until a change is signalled
    (as Django's own cached settings are not: only override_settings and the like are supported)."""
    before = keyed.REAP_INTERVAL_SECONDS
    wrapped = django_settings._wrapped
    had = "KEYED_QUEUE_REAP_INTERVAL_SECONDS" in wrapped.__dict__
    old = wrapped.__dict__.get("KEYED_QUEUE_REAP_INTERVAL_SECONDS")
    wrapped.KEYED_QUEUE_REAP_INTERVAL_SECONDS = before + 1
    try:
        assert keyed.REAP_INTERVAL_SECONDS == before
        with override_settings(KEYED_QUEUE_LEASE_SECONDS=3.0):  # any change of ours: all are read again
            assert keyed.REAP_INTERVAL_SECONDS == before + 1
    finally:
        if had:
            wrapped.KEYED_QUEUE_REAP_INTERVAL_SECONDS = old
        else:
            del wrapped.KEYED_QUEUE_REAP_INTERVAL_SECONDS
        keyed.forget()
    assert keyed.REAP_INTERVAL_SECONDS == before


def test_an_unknown_name_is_refused_and_nothing_is_kept():
    with pytest.raises(AttributeError, match="unknown keyed_queue setting 'LEASE_SECOND'"):
        keyed.LEASE_SECOND  # noqa: B018
    assert "LEASE_SECOND" not in keyed._read
