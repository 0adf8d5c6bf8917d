"""System checks: ``keyed_queue.E001`` ... and ``keyed_queue.W001`` ..."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from django.apps import AppConfig
from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.core.exceptions import ImproperlyConfigured

from .conf import DEFAULTS, INTERNAL, MAX_RECORD_DELAY_SECONDS, MAX_TOP_KEYS, PREFIX, settings
from .gate.clients import SENTINEL_SCHEME, is_sentinel_url
from .pools import configured_pools


@register()
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    return [
        *_unknown_settings(),
        *_redis_url_problems(),
        *_redis_wait_problems(),
        *_number_problems(),
        *_metrics_token_problems(),
        *_database_problems(),
        *_pool_problems(),
    ]


def _unknown_settings() -> list[CheckMessage]:
    """A ``KEYED_QUEUE_`` setting no version reads: most often a typo, which would leave the default at work."""
    return [
        Warning(
            f"Unknown setting {name}.",
            hint=f"Known settings: {', '.join(PREFIX + n for n in sorted(DEFAULTS))}.",
            id="keyed_queue.W001",
        )
        for name in dir(django_settings)
        if name.startswith(PREFIX) and name[len(PREFIX) :] not in DEFAULTS | INTERNAL
    ]


def _number_problems() -> list[CheckMessage]:
    """Durations, sizes and counts outside the range the gate and the writers work in."""
    problems: list[CheckMessage] = []
    for name in (
        "LEASE_SECONDS",
        "DISPATCH_TIMEOUT_SECONDS",
        "IDLE_HORIZON_SECONDS",
        "RECORD_FLUSH_SECONDS",
        "REAP_INTERVAL_SECONDS",
        "IDEMPOTENCY_TTL_SECONDS",
    ):
        value = getattr(settings, name)
        if not _is_number(value) or value <= 0:
            problems.append(
                Error(f"KEYED_QUEUE_{name} must be a positive number of seconds, got {value!r}.", id="keyed_queue.E002")
            )
    handoff = settings.LOCAL_HANDOFF_SECONDS
    if not _is_number(handoff) or handoff < 0:
        problems.append(
            Error(
                f"KEYED_QUEUE_LOCAL_HANDOFF_SECONDS must be a number of seconds >= 0, got {handoff!r}.",
                id="keyed_queue.E003",
            )
        )
    delay = settings.RECORD_DELAY_SECONDS
    if not (_is_number(delay) and 0 <= delay <= MAX_RECORD_DELAY_SECONDS):
        problems.append(
            Error(
                f"KEYED_QUEUE_RECORD_DELAY_SECONDS must be a number of seconds from 0 to "
                f"{MAX_RECORD_DELAY_SECONDS:g}, got {delay!r}.",
                hint="A writer's claim on a key must outlast it; it is also how long a loss of Redis' data "
                "loses submissions whose rows were not written.",
                id="keyed_queue.E012",
            )
        )
    for name in ("MAX_WAITING", "MAX_MESSAGE_BYTES"):
        value = getattr(settings, name)
        if value is not None and not (_is_number(value) and value == int(value) and value > 0):
            problems.append(
                Error(
                    f"KEYED_QUEUE_{name} must be a positive whole number or None, got {value!r}.", id="keyed_queue.E004"
                )
            )
    top = settings.METRICS_TOP_KEYS
    if not (_is_number(top) and top == int(top) and 0 <= top <= MAX_TOP_KEYS):
        problems.append(
            Error(
                f"KEYED_QUEUE_METRICS_TOP_KEYS must be a whole number from 0 to {MAX_TOP_KEYS}, got {top!r}.",
                hint="It is how many keys the metrics may name, each a series of its own.",
                id="keyed_queue.E010",
            )
        )
    return problems


def _pool_problems() -> list[CheckMessage]:
    try:
        configured_pools()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint='e.g. {"payments": {"limit": 10, "rate": "20/s"}}', id="keyed_queue.E013")]
    return []


def _metrics_token_problems() -> list[CheckMessage]:
    """A token that no request can send, or one a setting makes moot. Never says the token itself."""
    token = settings.METRICS_TOKEN
    if token is None:
        return []
    if not isinstance(token, str) or not token:
        what = "an empty text" if isinstance(token, str) else f"a {type(token).__name__}"
        return [
            Error(
                f"KEYED_QUEUE_METRICS_TOKEN must be None or a non-empty text, got {what}.",
                hint='Make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"',
                id="keyed_queue.E011",
            )
        ]
    if not all("!" <= c <= "~" for c in token):
        return [
            Error(
                "KEYED_QUEUE_METRICS_TOKEN has a space, a control character or a character outside ASCII: "
                "no Authorization header carries it as it is, so no scrape would match.",
                hint="A token read from a file ends with its newline: strip it (Prometheus' credentials_file "
                "strips its own).",
                id="keyed_queue.E011",
            )
        ]
    if settings.METRICS_PUBLIC:
        return [
            Warning(
                "KEYED_QUEUE_METRICS_PUBLIC is True, so the metrics answer anyone: KEYED_QUEUE_METRICS_TOKEN "
                "is never asked for.",
                hint="Leave KEYED_QUEUE_METRICS_PUBLIC out to require the token (or a staff login).",
                id="keyed_queue.W002",
            )
        ]
    return []


def _redis_url_problems() -> list[CheckMessage]:
    """A gate URL no client can use, or one that disagrees with the Sentinel and Cluster settings."""
    url, cluster, master = settings.REDIS_URL, settings.REDIS_CLUSTER, settings.REDIS_SENTINEL_MASTER
    if not isinstance(url, str) or urlparse(url).scheme not in ("redis", "rediss", "unix", SENTINEL_SCHEME):
        return [
            Error(
                f"KEYED_QUEUE_REDIS_URL must be a redis://, rediss://, unix:// or sentinel:// URL, got {url!r}.",
                id="keyed_queue.E001",
            )
        ]
    problems: list[CheckMessage] = []
    sentinel = is_sentinel_url(url)
    if sentinel and not (isinstance(master, str) and master):
        problems.append(
            Error(
                f"KEYED_QUEUE_REDIS_URL is a Sentinel URL ({url!r}) but KEYED_QUEUE_REDIS_SENTINEL_MASTER names no "
                f"master, got {master!r}.",
                hint='Set KEYED_QUEUE_REDIS_SENTINEL_MASTER to the name the sentinels monitor, e.g. "mymaster".',
                id="keyed_queue.E007",
            )
        )
    if master is not None and not sentinel:
        problems.append(
            Error(
                f"KEYED_QUEUE_REDIS_SENTINEL_MASTER is {master!r} but KEYED_QUEUE_REDIS_URL is no Sentinel URL: "
                f"{url!r}.",
                hint="Name the sentinels: sentinel://host:26379;sentinel://host2:26379.",
                id="keyed_queue.E007",
            )
        )
    if not isinstance(cluster, bool):
        problems.append(
            Error(f"KEYED_QUEUE_REDIS_CLUSTER must be True or False, got {cluster!r}.", id="keyed_queue.E008")
        )
    elif cluster and sentinel:
        problems.append(
            Error(
                "KEYED_QUEUE_REDIS_CLUSTER is True but KEYED_QUEUE_REDIS_URL is a Sentinel URL.", id="keyed_queue.E008"
            )
        )
    elif cluster and (database := urlparse(url).path.strip("/")) not in ("", "0"):
        problems.append(
            Error(
                f"KEYED_QUEUE_REDIS_URL names database {database!r}, but a Redis Cluster has "
                f"database 0 only ({url!r}).",
                hint="Drop the database from the URL: every key the gate writes starts with keyed_queue:.",
                id="keyed_queue.E008",
            )
        )
    return problems


def _redis_wait_problems() -> list[CheckMessage]:
    """How many replicas a write waits for, and for how long."""
    problems: list[CheckMessage] = []
    replicas, timeout = settings.REDIS_WAIT_REPLICAS, settings.REDIS_WAIT_TIMEOUT_SECONDS
    if not (isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 0):
        problems.append(
            Error(
                f"KEYED_QUEUE_REDIS_WAIT_REPLICAS must be a whole number >= 0, got {replicas!r}.", id="keyed_queue.E009"
            )
        )
    if not _is_number(timeout) or timeout <= 0:
        problems.append(
            Error(
                f"KEYED_QUEUE_REDIS_WAIT_TIMEOUT_SECONDS must be a positive number of seconds, got {timeout!r}.",
                id="keyed_queue.E009",
            )
        )
    return problems


#: The router that sends the records to ``KEYED_QUEUE_DATABASE``.
ROUTER = "django_keyed_queue.records.router.KeyedQueueRouter"


def _database_problems() -> list[CheckMessage]:
    alias = settings.DATABASE
    if alias is None:
        return []
    if alias not in django_settings.DATABASES:
        return [
            Error(
                f"KEYED_QUEUE_DATABASE names {alias!r}, which is not a database of DATABASES.",
                hint=f"Use one of: {', '.join(sorted(django_settings.DATABASES))}.",
                id="keyed_queue.E005",
            )
        ]
    routers = [
        r if isinstance(r, str) else f"{type(r).__module__}.{type(r).__qualname__}"
        for r in django_settings.DATABASE_ROUTERS
    ]
    if ROUTER not in routers:
        return [
            Error(
                f"KEYED_QUEUE_DATABASE is set but {ROUTER} is not in DATABASE_ROUTERS: the records would "
                f"stay in the default database.",
                hint=f'Add "{ROUTER}" to DATABASE_ROUTERS.',
                id="keyed_queue.E006",
            )
        ]
    return []


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
