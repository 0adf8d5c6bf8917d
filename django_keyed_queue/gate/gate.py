"""The gate: one atomic Lua call per state transition of a ticket."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import redis

from .keys import KeyNames
from .scripts import SCRIPT_NAMES, Code, ms_to_seconds, seconds_to_ms, source

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grant:
    """A ticket the gate just granted: its message must now be published."""

    key: str
    ticket: int
    dispatch: int
    message: bytes


@dataclass(frozen=True)
class SubmitResult:
    ticket: int
    granted: bool
    #: Fencing token when the submission also started the ticket, else 0.
    token: int = 0


@dataclass(frozen=True)
class StartResult:
    code: Code
    token: int = 0
    attempts: int = 0
    lease_deadline_ms: int = 0

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


@dataclass(frozen=True)
class FinishResult:
    code: Code
    granted: list[Grant] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


@dataclass(frozen=True)
class Lease:
    """A running ticket as its worker process knows it."""

    key: str
    ticket: int
    token: int


class Gate:
    """Per-key FIFO of tickets in Redis; at most ``limit`` tickets of a key hold a slot.

    Every method is one script call (one round trip) unless it says otherwise.
    Durations are seconds at this API and milliseconds inside Redis.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        lease_seconds: float = 60.0,
        dispatch_timeout_seconds: float = 300.0,
        idle_horizon_seconds: float = 86400.0,
    ) -> None:
        self.client = client
        self.lease_ms = seconds_to_ms(lease_seconds)
        self.dispatch_timeout_ms = seconds_to_ms(dispatch_timeout_seconds)
        self.idle_horizon_ms = seconds_to_ms(idle_horizon_seconds)
        self._scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}

    def _call(self, name: str, keys: Sequence[str], args: Sequence[object]) -> list:
        return self._scripts[name](keys=keys, args=args)

    def submit(
        self, key: str, message: bytes, *, limit: int = 1, start: bool = False, join_id: str = ""
    ) -> SubmitResult | None:
        """Take the next ticket of ``key`` and store ``message`` with it.

        With ``start=True`` a granted ticket is also started (its lease begins).
        A non-empty ``join_id`` seen before within the idle horizon makes this a
        duplicate: nothing changes and None is returned.
        """
        names = KeyNames(key)
        code, ticket, token, _ = self._call(
            "submit",
            [*names.all(), names.joined],
            [
                message,
                limit,
                self.dispatch_timeout_ms,
                self.lease_ms if start else 0,
                join_id,
                self.idle_horizon_ms,
            ],
        )
        if code == Code.DUPLICATE:
            logger.debug("submit key=%r join_id=%s duplicate", key, join_id)
            return None
        result = SubmitResult(ticket=int(ticket), granted=code == Code.OK, token=int(token))
        logger.debug("submit key=%r ticket=%s granted=%s", key, result.ticket, result.granted)
        return result

    def start(self, key: str, ticket: int, dispatch: int) -> StartResult:
        """Check the message of dispatch ``dispatch`` may run ``ticket`` and start its lease."""
        names = KeyNames(key)
        code, token, attempts, deadline = self._call(
            "start", [names.meta, names.holders], [ticket, dispatch, self.lease_ms]
        )
        result = StartResult(Code(code), int(token), int(attempts), int(deadline))
        logger.debug("start key=%r ticket=%s code=%s", key, ticket, result.code.name)
        return result

    def finish(self, key: str, ticket: int, token: int, *, limit: int = 1) -> FinishResult:
        """End a running ticket and grant the next ones; their messages are returned."""
        reply = self._call(
            "finish",
            KeyNames(key).all(),
            [ticket, token, limit, self.dispatch_timeout_ms, self.idle_horizon_ms],
        )
        result = FinishResult(Code(reply[0]), self._grants(key, reply[1:]))
        logger.debug(
            "finish key=%r ticket=%s code=%s granted=%s",
            key,
            ticket,
            result.code.name,
            [g.ticket for g in result.granted],
        )
        return result

    def retry(self, key: str, ticket: int, token: int, message: bytes, *, countdown_seconds: float) -> int | None:
        """Keep ``ticket``'s slot through a retry; returns the retry's dispatch, None if fenced."""
        names = KeyNames(key)
        code, dispatch = self._call(
            "retry",
            [names.messages, names.holders],
            [ticket, token, seconds_to_ms(countdown_seconds), self.dispatch_timeout_ms, message],
        )
        logger.debug("retry key=%r ticket=%s code=%s dispatch=%s", key, ticket, Code(code).name, dispatch)
        return int(dispatch) if code == Code.OK else None

    def cancel(self, key: str, ticket: int, *, limit: int = 1, forget: bool = False) -> FinishResult:
        """Withdraw a ticket that has not started; returns tickets granted in its place.

        ``forget=True`` is for a submission that failed before anyone saw its
        ticket: the ticket number is given back when it was the last one taken.
        """
        reply = self._call(
            "cancel",
            KeyNames(key).all(),
            [ticket, limit, self.dispatch_timeout_ms, self.idle_horizon_ms, int(forget)],
        )
        result = FinishResult(Code(reply[0]), self._grants(key, reply[1:]))
        logger.debug("cancel key=%r ticket=%s code=%s", key, ticket, result.code.name)
        return result

    def renew(self, leases: Iterable[Lease]) -> dict[Lease, bool]:
        """Extend many leases in one round trip (one script call per key, pipelined)."""
        by_key: dict[str, list[Lease]] = {}
        for lease in leases:
            by_key.setdefault(lease.key, []).append(lease)
        if not by_key:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for key, held in by_key.items():
            args: list[object] = [self.lease_ms]
            for lease in held:
                args += [lease.ticket, lease.token]
            self._scripts["renew"](keys=[KeyNames(key).holders], args=args, client=pipe)
        outcome: dict[Lease, bool] = {}
        for held, reply in zip(by_key.values(), pipe.execute(), strict=True):
            outcome.update({lease: bool(ok) for lease, ok in zip(held, reply, strict=True)})
        return outcome

    def inspect(self, key: str) -> dict:
        """A read-only snapshot of one key (several reads in one pipelined round trip)."""
        names = KeyNames(key)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(names.meta)
        pipe.lrange(names.queue, 0, -1)
        pipe.hgetall(names.holders)
        pipe.hlen(names.messages)
        pipe.pttl(names.meta)
        pipe.time()
        meta, queue, holders, messages, ttl_ms, (secs, micros) = pipe.execute()
        now_ms = secs * 1000 + micros // 1000
        return {
            "key": key,
            "last_ticket": int(meta.get(b"seq", 0)),
            "last_token": int(meta.get(b"fence", 0)),
            "paused": b"paused" in meta,
            "waiting": [int(t) for t in queue],
            "holders": {int(t): _decode_holder(raw, now_ms) for t, raw in holders.items()},
            "messages": messages,
            "idle_expires_in": ms_to_seconds(ttl_ms) if ttl_ms >= 0 else None,
        }

    def _grants(self, key: str, flat: list) -> list[Grant]:
        return [Grant(key, int(flat[i]), int(flat[i + 1]), flat[i + 2]) for i in range(0, len(flat), 3)]


def _decode_holder(raw: bytes, now_ms: int) -> dict:
    state, dispatch, token, deadline, attempts = raw.decode().split("|")
    return {
        "state": "running" if state == "r" else "granted",
        "dispatch": int(dispatch),
        "token": int(token),
        "attempts": int(attempts),
        "deadline_in": ms_to_seconds(int(deadline) - now_ms),
    }


__all__ = ["FinishResult", "Gate", "Grant", "Lease", "StartResult", "SubmitResult"]
