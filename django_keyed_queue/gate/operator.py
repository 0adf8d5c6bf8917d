"""An operator's hold on keys: pause and resume, the lists of paused and blocked keys, refused joins.

The paused and blocked keys are each listed in one SET of its own (``keys.PAUSED_KEYS``,
``keys.BLOCKED_KEYS``), so that the live keys page finds them without reading every key. A
SET of its own is in no key's slot, so no script of a key can write it on a Redis Cluster:
a list is kept by a command of its own, in the order that errs on the safe side (each method
says which).
"""

from __future__ import annotations

import logging

from . import override as overriding
from . import pause as pausing
from . import refuse_join as refusing_join
from . import run_now as running_now
from .base import text
from .inspection import InspectCalls, stored_task_id
from .keys import BLOCKED_KEYS, OVERRIDDEN_KEYS, PAUSED_KEYS, KeyNames
from .override import UNCHANGED, Unchanged
from .results import Grant, Overridden

logger = logging.getLogger(__name__)


class OperatorCalls(InspectCalls):
    """Pause, resume, list paused and blocked keys, refuse a delayed task's join.

    Derives from :class:`~.inspection.InspectCalls`: :meth:`blocked_keys` checks its list against
    the keys' snapshots.
    """

    def pause(self, key: str, *, by: str = "") -> None:
        """Grant nothing more on ``key``: running tasks finish, submissions queue in order. ``by`` (who
        paused it) and the time are kept for the operator who finds the key paused."""
        # Listed first, in a call of its own, so that every paused key is listed (a listed key may
        # have failed to pause).
        self.client.sadd(PAUSED_KEYS, key)
        self._call(pausing.call(key, self, pause=True, by=by))

    def resume(self, key: str) -> list[Grant] | None:
        """Let ``key`` grant again; returns the tickets granted at once, to be published, or None if the key
        was not paused (two racing resumes: one resumes it, the other is told so)."""
        reply = self._call_and_index(pausing.call(key, self, pause=False), key)
        # Unlisted after, in a call of its own, so that a key is never unlisted while it is still paused.
        self.client.srem(PAUSED_KEYS, key)
        return pausing.parse(key, reply, self.pushes.pushed)

    def set_overrides(self, key: str, *, limit: int | None | Unchanged = UNCHANGED,
                      interval_ms: int | None | Unchanged = UNCHANGED) -> Overridden:  # fmt: skip
        """Give ``key`` an operator's ``limit`` and rate (``interval_ms``, the least ms between two starts)
        over its tasks' own, or None to go back to them; ``UNCHANGED`` leaves one as it is. They apply
        from the next grant and start on; a raised limit grants waiting tickets at once, returned to be
        published; a lowered one takes back grants never started, newest first, down to it (they wait
        again; see ``override.lua``). Setting the same again changes nothing."""
        call = overriding.call(key, self, limit=limit, interval_ms=interval_ms)
        # Listed first, in a call of its own, so that every overridden key is listed.
        self.client.sadd(OVERRIDDEN_KEYS, key)
        reply = self._call_and_index(call, key)
        # Listed again after: a clear racing this set may have unlisted it between the first SADD and the script.
        self._list_as_overridden([key])
        withdrawn, granted = overriding.parse(key, reply, self.pushes.pushed)
        messages = self.client.hmget(KeyNames(key).messages, withdrawn) if withdrawn else []
        return Overridden(granted, [(t, stored_task_id(m)) for t, m in zip(withdrawn, messages, strict=True)])

    def _overridden_of(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have an operator's limit or rate (one pipelined read of their meta)."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(KeyNames(key).meta, "limit_override", "interval_override")
        return {key for key, values in zip(keys, pipe.execute(), strict=True) if any(v is not None for v in values)}

    def _list_as_overridden(self, keys: list[str]) -> set[str]:
        """List those of ``keys`` with an override, unlist the others; which have one. An unlisted key whose
        override a racing set wrote meanwhile is listed again: a key stays listed if any set's script ran
        last, and is unlisted only if a clear's did."""
        overridden = self._overridden_of(keys) if keys else set()
        if overridden:
            self.client.sadd(OVERRIDDEN_KEYS, *overridden)
        if stale := [key for key in keys if key not in overridden]:
            self.client.srem(OVERRIDDEN_KEYS, *stale)
            if back := self._overridden_of(stale):
                self.client.sadd(OVERRIDDEN_KEYS, *back)
                overridden |= back
        return overridden

    def overridden_keys(self, *, limit: int | None = None) -> list[str]:
        """The keys given a limit or rate of their own (:meth:`set_overrides`); at most ``limit`` of them.

        Checked against each key's meta, so that the list and the overrides agree (:meth:`_list_as_overridden`).
        """
        listed = self._listed(OVERRIDDEN_KEYS, limit)
        overridden = self._list_as_overridden(listed)
        return [key for key in listed if key in overridden]

    def is_paused(self, key: str) -> bool:
        """Whether :meth:`pause` paused ``key`` and :meth:`resume` did not resume it since."""
        return bool(self.client.sismember(PAUSED_KEYS, key))

    def paused_keys(self, *, limit: int | None = None) -> list[str]:
        """The keys paused by :meth:`pause` and not resumed since; at most ``limit`` of them, read in steps."""
        return self._listed(PAUSED_KEYS, limit)

    def blocked_keys(self, *, limit: int | None = None) -> list[str]:
        """The keys a failed ticket blocks (see :meth:`finish`); at most ``limit`` of them.

        Listed when a ticket that may block failed, and checked here: a key listed but not
        blocked (its finish was fenced, or it was unblocked meanwhile) is taken off the list.
        """
        listed = self._listed(BLOCKED_KEYS, limit)
        blocked = [s.key for s in self.inspect_many(listed, waiting_shown=0) if s.blocked is not None]
        if stale := set(listed) - set(blocked):
            self.client.srem(BLOCKED_KEYS, *stale)
        return blocked

    def _listed(self, name: str, limit: int | None) -> list[str]:
        """The members of the SET ``name``, sorted; at most ``limit`` of them, read in steps."""
        if limit is None:
            return sorted(text(member) for member in self.client.smembers(name))
        found: list[str] = []
        for member in self.client.sscan_iter(name, count=min(limit, 1000)):
            found.append(text(member))
            if len(found) == limit:
                break
        return sorted(found)

    def run_now(self, key: str, ticket: int, dispatch: int) -> Grant | None:
        """Start the granted ``ticket`` now, which waits for its key's rate or its message's eta: the grant to
        publish again, with its next dispatch (without an eta: that dispatch starts whatever the rate). None
        if it is not granted with ``dispatch`` (it started, ended or moved on)."""
        return running_now.parse(key, ticket, self._call_and_index(running_now.call(key, ticket, dispatch, self), key))

    def refuse_join(self, key: str, task_id: str, *, due_in_seconds: float = 0.0) -> bool:
        """Make sure the delayed task ``task_id`` never joins ``key``'s queue.

        False if it already joined (it has a ticket: cancel that instead).
        """
        reply = self._call(refusing_join.call(key, task_id, self, due_in_seconds=due_in_seconds))
        return refusing_join.parse(key, task_id, reply)
