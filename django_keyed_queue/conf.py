"""``KEYED_QUEUE_*`` settings, read from ``django.conf.settings`` on first use and kept until one changes.

Nothing is read at import. Every run reads several of them, so each is read once and kept; Django's
``setting_changed`` (which ``override_settings`` and pytest-django's ``settings`` send) forgets them all.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

PREFIX = "KEYED_QUEUE_"

#: Most keys ``METRICS_TOP_KEYS`` may name in the metrics.
MAX_TOP_KEYS = 50
#: Longest ``RECORD_DELAY_SECONDS``: well within a records' writer's claim on a key (10 s), which a
#: submission made during the claim must be able to undercut (see claim_unwritten.lua).
MAX_RECORD_DELAY_SECONDS = 5.0

DEFAULTS: dict[str, Any] = {
    # Redis holding the gate (may differ from the Celery broker): redis://, rediss://, unix://, or
    # "sentinel://host:26379;sentinel://host2:26379" with REDIS_SENTINEL_MASTER.
    "REDIS_URL": "redis://localhost:6379/0",
    # REDIS_URL names a node of a Redis Cluster (database 0); the client finds the others.
    "REDIS_CLUSTER": False,
    # The name of the master the sentinels of a sentinel:// REDIS_URL monitor.
    "REDIS_SENTINEL_MASTER": None,
    # Each gate transition waits until this many replicas have it (WAIT), so a failover cannot
    # lose it; 0: Redis's asynchronous replication (see the deployment docs for what that risks).
    "REDIS_WAIT_REPLICAS": 0,
    # How long a transition waits for its replicas; past it the call fails as if its reply was lost.
    "REDIS_WAIT_TIMEOUT_SECONDS": 1.0,
    # A running task's lease, renewed by its worker process; measured on the Redis clock.
    "LEASE_SECONDS": 60.0,
    # A granted ticket not started within this time has its message published again.
    "DISPATCH_TIMEOUT_SECONDS": 300.0,
    # How often the reaper looks for lost runs and lost messages.
    "REAP_INTERVAL_SECONDS": 5.0,
    # Every worker runs the reaper in a thread (several reapers are safe); False leaves it
    # to the beat entry (added to `celery beat` unless it has one) and the command.
    "WORKER_REAPER": True,
    # A submission's row is written by the workers once its record in Redis is this old; a run that
    # ends sooner writes its row once, in its final state. A loss of Redis' data within it loses the
    # submission's record (see docs/guarantees.md). At most 5.
    "RECORD_DELAY_SECONDS": 5.0,
    # A worker process that finished a task runs its key's next tasks itself, without a
    # broker round trip, for up to this long; then it publishes them. 0 publishes every one.
    "LOCAL_HANDOFF_SECONDS": 0.25,
    # A duplicate submission within this window returns the original task.
    "IDEMPOTENCY_TTL_SECONDS": 86400.0,
    # An explicit idempotency key reused with other arguments raises IdempotencyConflict;
    # False returns the original task, as for a duplicate.
    "IDEMPOTENCY_CHECK_ARGUMENTS": True,
    # Most tasks that may wait behind one key (a task's max_waiting overrides it); None: no limit.
    "MAX_WAITING": None,
    # Largest task message accepted at submission, in bytes; None: no limit.
    "MAX_MESSAGE_BYTES": 1024 * 1024,
    # The database alias of the records (KeyedTask, IdempotencyKey), with
    # "django_keyed_queue.records.router.KeyedQueueRouter" in DATABASE_ROUTERS; None: as routed.
    "DATABASE": None,
    # delay()/apply_async() of a keyed task inside transaction.atomic() waits for the commit, as
    # delay_on_commit() does; False takes the ticket at once, as Celery publishes at once.
    "SUBMIT_ON_COMMIT": False,
    # The health view answers anyone, not only staff (for a load balancer's probe).
    "HEALTH_PUBLIC": False,
    # The metrics view answers anyone, with no login or token (for a Prometheus server on a private
    # network); False: a logged-in staff user who may view keyed tasks, or METRICS_TOKEN.
    "METRICS_PUBLIC": False,
    # A bearer token that lets a request read the metrics without a login, as Prometheus' scrape
    # config sends it (`authorization: {credentials: ...}`); None: no token lets anyone in.
    "METRICS_TOKEN": None,
    # The metrics also list this many keys whose oldest waiting task waited longest, each key a label
    # value (at most 50); 0: no key is ever a label.
    "METRICS_TOP_KEYS": 0,
    # Named pools, each a limit and a rate shared by every key and worker: {"payments": {"limit": 10,
    # "rate": "20/s"}, "mail": {"rate": "5/s"}}; a task joins one with pool="payments".
    "POOLS": {},
    # Dotted path or callable (task_name, args, kwargs) -> (args, kwargs) applied
    # before arguments are written to KeyedTask.arguments.
    "REDACT_ARGUMENTS": None,
}

#: The gate's and the records' own timings: readable as settings (``KEYED_QUEUE_<NAME>``, for the tests and
#: for a case a maintainer measures), not documented as settings: no project should need to change them.
INTERNAL: dict[str, Any] = {
    # A drained key's counters stay this long, keeping fencing tokens monotonic.
    "IDLE_HORIZON_SECONDS": 86400.0,
    # Worker-side record writes are batched and flushed at this interval. Each flush of each
    # worker process is a transaction: on SQLite it holds the whole database's write lock, and the
    # project's own tasks wait for it (at 0.2 s a busy project's task took 6 ms longer on SQLite and
    # 9 ms on PostgreSQL; see docs/benchmarks.md).
    "RECORD_FLUSH_SECONDS": 1.0,
}


class Settings:
    def __init__(self) -> None:
        self._read: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self._read[name]
        except KeyError:
            pass
        try:
            default = DEFAULTS[name] if name in DEFAULTS else INTERNAL[name]
        except KeyError:
            raise AttributeError(f"unknown keyed_queue setting {name!r}") from None
        value = self._read[name] = getattr(django_settings, PREFIX + name, default)
        return value

    def forget(self) -> None:
        """Read every setting again on its next use."""
        self._read = {}


settings = Settings()


def _forget_changed(setting: str, **_: object) -> None:
    if setting.startswith(PREFIX):
        settings.forget()


setting_changed.connect(_forget_changed)
