"""The app inside a Django project: migrations, checks, settings."""

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_keyed_queue.checks import check_settings
from django_keyed_queue.conf import settings
from django_keyed_queue.records.models import KeyedTask


@pytest.mark.django_db(databases=["default", "queue"])  # makemigrations looks at every database
def test_no_migration_is_missing():
    call_command("makemigrations", "keyed_queue", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db(databases=["default", "queue"])
def test_the_migration_makes_the_search_s_prefix_indexes_on_postgresql_alone():
    """The admin's search reads a key's or a task id's start as LIKE 'abc%': on PostgreSQL only an index
    with ``varchar_pattern_ops`` serves it, and the migration makes one for each; SQLite needs neither."""
    connection = connections[KeyedTask.objects.db]
    with connection.cursor() as cursor:
        indexes = connection.introspection.get_constraints(cursor, KeyedTask._meta.db_table)
    made = {name: spec["columns"] for name, spec in indexes.items() if name.endswith("_prefix")}
    if connection.vendor == "postgresql":
        assert made == {"keyed_task_key_prefix": ["key", "id"], "keyed_task_id_prefix": ["task_id"]}
    else:
        assert made == {}


def test_settings_are_read_on_every_access():
    with override_settings(KEYED_QUEUE_LEASE_SECONDS=7):
        assert settings.LEASE_SECONDS == 7
    assert settings.LEASE_SECONDS == 60.0


def test_unknown_setting_warns():
    with override_settings(KEYED_QUEUE_LEASE=5):
        assert [p.id for p in check_settings()] == ["keyed_queue.W001"]


def test_an_internal_timing_is_read_as_a_setting_without_a_warning_and_is_not_a_documented_one():
    from django_keyed_queue.conf import DEFAULTS, INTERNAL

    with override_settings(KEYED_QUEUE_RECORD_FLUSH_SECONDS=0.3):
        assert settings.RECORD_FLUSH_SECONDS == 0.3 and check_settings() == []
    assert not set(INTERNAL) & set(DEFAULTS), "the settings page lists DEFAULTS only"


def test_bad_values_are_errors():
    with override_settings(KEYED_QUEUE_REDIS_URL="localhost:6379", KEYED_QUEUE_LEASE_SECONDS=0):
        assert sorted(p.id for p in check_settings()) == ["keyed_queue.E001", "keyed_queue.E002"]


def test_local_handoff_may_be_off_but_not_negative():
    with override_settings(KEYED_QUEUE_LOCAL_HANDOFF_SECONDS=0):
        assert check_settings() == []
    with override_settings(KEYED_QUEUE_LOCAL_HANDOFF_SECONDS=-1):
        assert [p.id for p in check_settings()] == ["keyed_queue.E003"]


@pytest.mark.parametrize("name", ["KEYED_QUEUE_MAX_WAITING", "KEYED_QUEUE_MAX_MESSAGE_BYTES"])
def test_bounds_are_positive_whole_numbers_or_none(name):
    for good in (None, 1, 10_000):
        with override_settings(**{name: good}):
            assert check_settings() == []
    for bad in (0, -1, 2.5, "100", True):
        with override_settings(**{name: bad}):
            assert [p.id for p in check_settings()] == ["keyed_queue.E004"], bad


def test_the_metrics_name_at_most_fifty_keys():
    for good in (0, 1, 50):
        with override_settings(KEYED_QUEUE_METRICS_TOP_KEYS=good):
            assert check_settings() == []
    for bad in (-1, 51, 2.5, "5", True, None):
        with override_settings(KEYED_QUEUE_METRICS_TOP_KEYS=bad):
            assert [p.id for p in check_settings()] == ["keyed_queue.E010"], bad


def test_the_record_delay_is_within_a_writer_s_claim():
    for good in (0, 0.5, 2, 5.0):
        with override_settings(KEYED_QUEUE_RECORD_DELAY_SECONDS=good):
            assert check_settings() == []
    for bad in (-1, 5.5, 60, "2", None, True, float("nan")):
        with override_settings(KEYED_QUEUE_RECORD_DELAY_SECONDS=bad):
            assert [p.id for p in check_settings()] == ["keyed_queue.E012"], bad


def test_the_project_checks_clean():
    assert check_settings() == []


def test_a_metrics_token_is_a_text_a_header_can_carry_and_the_checks_never_show_it():
    for good in (None, "kq-0123456789abcdef", "a.b~c+d/e="):
        with override_settings(KEYED_QUEUE_METRICS_TOKEN=good):
            assert check_settings() == []
    secret = "s3cret-token-value"
    for bad in ("", b"s3cret-token-value", 12345, True, f"{secret}\n", f" {secret}", "s3cret token", "s3crét", "\x00"):
        with override_settings(KEYED_QUEUE_METRICS_TOKEN=bad):
            problems = check_settings()
        assert [p.id for p in problems] == ["keyed_queue.E011"], bad
        assert secret not in f"{problems[0].msg} {problems[0].hint}" and "s3cr" not in problems[0].msg


def test_a_metrics_token_beside_public_metrics_is_a_warning():
    with override_settings(KEYED_QUEUE_METRICS_TOKEN="kq-0123456789abcdef", KEYED_QUEUE_METRICS_PUBLIC=True):
        assert [p.id for p in check_settings()] == ["keyed_queue.W002"]
