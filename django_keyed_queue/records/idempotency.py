"""Idempotency keys: a duplicate submission within the window returns the original task.

A key is claimed with one INSERT on a unique fingerprint, so concurrent
submitters in any number of processes agree on one winner. A submission that
fails after claiming gives its key back. An explicit key reused with other
arguments is an error, as Stripe's are: the caller reused a key by mistake.

A duplicate returns the task that runs: the claim's task, or, if a newer
submission of its coalescing task replaced it while it waited, the end of the
chain of replacements (``resolve``), read from the rows and from the records
the gate keeps until the rows are written. The claim's pointer is moved along
the chain too (``repoint``), to keep the chain short, but no lookup depends on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings as django_settings
from django.db import DatabaseError, IntegrityError, connections, router, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.crypto import salted_hmac
from kombu.utils.json import dumps as kombu_json

from ..conf import settings
from ..exceptions import IdempotencyConflict, InvalidArguments
from .columns import IDEMPOTENCY_KEY_MAX_LENGTH, shown, unstorable
from .models import IdempotencyKey, KeyedTask
from .statuses import Status

if TYPE_CHECKING:
    from ..gate.views import RecordsGate

logger = logging.getLogger(__name__)

#: How long a duplicate waits for the original submission to be written or given up.
SETTLE_SECONDS = 5.0
#: The most replacements ``resolve`` follows: a bound, never reached by a key's real history.
MAX_REPLACEMENTS = 10_000
#: A task a newer submission can still replace: parked, or a debounced grant not started.
REPLACEABLE = (Status.WAITING, Status.DISPATCHED)


def explicit_fingerprint(task_name: str, key: str) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidArguments(f"{task_name}: idempotency_key must be a non-empty str, got {shown(key)}")
    problem = unstorable(key, IDEMPOTENCY_KEY_MAX_LENGTH)
    if problem:
        raise InvalidArguments(f"{task_name}: idempotency_key {shown(key)} {problem}")
    return _sha256(json.dumps(["key", task_name, key], ensure_ascii=False))


#: The salt of the arguments' digests: keyed with the project's secret, they tell nothing of the arguments.
DIGEST_SALT = "django_keyed_queue.idempotency.arguments"


def arguments_digests(task_name: str, arguments: dict[str, Any]) -> tuple[str, ...]:
    """What an explicit key's claim remembers of its arguments: an HMAC-SHA256 keyed with the project's
    ``SECRET_KEY`` (first, the one stored), then with each of its ``SECRET_KEY_FALLBACKS``, so that a claim
    made before the secret was rotated still matches; () (not compared) if not JSON-encodable."""
    try:
        canonical = _canonical(task_name, arguments)
    except InvalidArguments:
        return ()
    secrets = [django_settings.SECRET_KEY, *getattr(django_settings, "SECRET_KEY_FALLBACKS", [])]
    return tuple(salted_hmac(DIGEST_SALT, canonical, secret=s, algorithm="sha256").hexdigest() for s in secrets)


def arguments_fingerprint(task_name: str, arguments: dict[str, Any]) -> str:
    """SHA-256 over the task name and its bound arguments, in a canonical JSON encoding.

    Keyword order does not matter; values of different JSON types (1, 1.0,
    "1", true) stay different.
    """
    return _sha256(_canonical(task_name, arguments))


def _canonical(task_name: str, arguments: dict[str, Any]) -> str:
    try:
        return kombu_json(["args", task_name, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArguments(f"{task_name}: idempotent tasks need JSON-encodable arguments: {exc}") from exc


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def database() -> str:
    """The alias of the database the keys are claimed in."""
    return router.db_for_write(IdempotencyKey)


def claim(
    fingerprint: str, task_name: str, task_id: str, *, key: str | None = None, arguments: tuple[str, ...] = ()
) -> str | None:
    """Claim ``fingerprint`` for ``task_id``; None if claimed, else the original task's id.

    ``key`` and ``arguments`` (their digests, see ``arguments_digests``) are given for an explicit key: a
    claim made with other arguments raises IdempotencyConflict unless ``KEYED_QUEUE_IDEMPOTENCY_CHECK_ARGUMENTS``
    is off.
    """
    deadline = time.monotonic() + SETTLE_SECONDS
    db = database()
    while True:
        now = timezone.now()
        try:
            with transaction.atomic(using=db):
                IdempotencyKey.objects.using(db).create(
                    fingerprint=fingerprint,
                    task_id=task_id,
                    task_name=task_name,
                    arguments=arguments[0] if arguments else "",
                    key=key or "",
                    created_at=now,
                    expires_at=now + timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS),
                )
            return None
        except IntegrityError:
            pass
        original = IdempotencyKey.objects.using(db).filter(fingerprint=fingerprint).first()
        if original is None:
            continue  # given back or purged meanwhile: try again
        if original.task_id == task_id:
            return None  # already ours: an operator's retry moved the key to this task
        if original.expires_at <= now:
            IdempotencyKey.objects.using(db).filter(pk=original.pk, expires_at__lte=now).delete()
            continue
        if key is not None and _differ(original.arguments, arguments) and settings.IDEMPOTENCY_CHECK_ARGUMENTS:
            raise IdempotencyConflict(
                f"{task_name}: idempotency_key {key!r} was used by task {original.task_id} with other "
                f"arguments; a new request needs a new key"
            )
        # The original may still be on its way: its record is written right after its claim.
        written = KeyedTask.objects.using(db).filter(task_id=original.task_id).exists()
        # Waiting inside a transaction would not see it commit.
        if written or time.monotonic() > deadline or connections[db].in_atomic_block:
            return _answered(original, now, db)
        time.sleep(0.02)


def _answered(original: IdempotencyKey, now: datetime, db: str) -> str:
    """``original`` answers a duplicate: its task is returned, and the duplicate counted on its row once
    the duplicate's transaction commits (a rolled-back one was never submitted; and the row is not locked
    for the length of the caller's transaction). A count that cannot be written is logged, not raised."""

    def count() -> None:
        try:
            IdempotencyKey.objects.using(db).filter(pk=original.pk).update(
                duplicates=F("duplicates") + 1, last_duplicate_at=now
            )
        except DatabaseError:
            logger.warning("a duplicate of %s was not counted", original.task_id, exc_info=True)

    transaction.on_commit(count, using=db)
    return original.task_id


def _differ(stored: str, given: tuple[str, ...]) -> bool:
    return bool(stored and given) and stored not in given


def unclaim(fingerprint: str, task_id: str) -> None:
    """Give back a claim whose submission failed: the key is not consumed."""
    IdempotencyKey.objects.filter(fingerprint=fingerprint, task_id=task_id).delete()


def resolve(gate: RecordsGate, task_id: str, key: str) -> str:
    """The task a claim on ``task_id`` stands for: ``task_id`` itself or, if a newer submission of its
    coalescing task replaced it while it waited, the last of the chain of replacements: the one that runs,
    ran or waits now. ``key``: where to look for a task whose row is not written yet (the duplicate's key).

    The chain is read where it is recorded: the rows (``superseded_by``, the whole chain in one query),
    then, while its last task's row is not written or it still waits, the superseded records the gate
    keeps until the writer writes them (one script call), and so on. The gate deletes a record only
    once its row is written: a replacement missing from the rows is in the gate, and the rows are read
    again after the gate found none, for one written between the two reads. So it holds whatever the
    order the replacements' hand-overs (``repoint``) ran in, and whether they ran at all.
    """
    hops, gate_kept_none = 0, False
    while True:  # each pass goes further, or the next one ends: at most 2 * MAX_REPLACEMENTS passes
        end = KeyedTask.objects.replacement(task_id, max_hops=MAX_REPLACEMENTS - hops)
        task_id, hops = end.task_id, hops + end.hops
        settled = end.status is not None and end.status not in REPLACEABLE  # it runs or it ended
        if settled or (gate_kept_none and not end.hops) or hops >= MAX_REPLACEMENTS:
            break
        try:
            task_id, moved = gate.replacement(
                end.key or key, task_id, ticket=end.ticket, max_hops=MAX_REPLACEMENTS - hops
            )
        except redis.RedisError as exc:
            logger.warning("%s: the gate's records of replacements are unreadable (%s): as the rows say", task_id, exc)
            break
        hops, gate_kept_none = hops + moved, not moved
    if hops >= MAX_REPLACEMENTS:
        logger.warning("%s ends a chain of %d replacements, the most followed; it may have others", task_id, hops)
    return task_id


def repoint(old_task_id: str, new_task_id: str) -> None:
    """Make the keys that resolve to one task resolve to another (its replacement, or its retry)."""
    IdempotencyKey.objects.filter(task_id=old_task_id).update(task_id=new_task_id)


def purge() -> int:
    """Delete expired keys; returns how many."""
    deleted, _ = IdempotencyKey.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted
