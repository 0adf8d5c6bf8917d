"""What every part of the gate shares: its client and settings, and the one script runner.

``Gate`` (gate.py) is composed of one class per concern (tickets.py, operator.py, unwritten.py,
reaping.py, inspection.py); each derives from :class:`GateBase`, so all of them send their
scripts through :meth:`GateBase._pipelined`: the one place that evaluates a script by name,
loads it again when Redis lost it (``NOSCRIPT``), pipelines many calls in one round trip and
goes through the transport that knows a cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from .calls import ScriptCall
from .keys import CLUSTER_INDEX_SHARDS, DEADLINE_INDEX, UNWRITTEN_INDEX, Index
from .pushes import Pushes, username
from .results import Grant
from .scripts import SCRIPT_NAMES, seconds_to_ms, source
from .transport import Command, Replication, transport_for


class GateBase:
    """The client, the durations in ms, the indexes, and the script runner of a :class:`~.gate.Gate`.

    Keys that may need the reaper are found through a sorted set, the
    deadline index (logical key -> when to look); on a Redis Cluster it is
    split in shards (see :class:`~.keys.Index`). It is not in the keys' slots,
    so the scripts cannot write it: each call that can create a holder sends
    a ``ZADD LT`` of an early estimate in the same round trip (``index=`` of
    :meth:`_pipelined`), and the reaper, after visiting a key, moves it to the
    key's real next deadline. The unwritten index (keys holding submission
    records not yet written to the database) is kept the same way.
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        lease_seconds: float = 60.0,
        dispatch_timeout_seconds: float = 300.0,
        idle_horizon_seconds: float = 86400.0,
        outcome_grace_seconds: float = 10.0,
        record_delay_seconds: float = 0.0,
        wait_replicas: int = 0,
        wait_timeout_seconds: float = 1.0,
    ) -> None:
        self.client = client
        self.lease_ms = seconds_to_ms(lease_seconds)
        self.dispatch_timeout_ms = seconds_to_ms(dispatch_timeout_seconds)
        self.idle_horizon_ms = seconds_to_ms(idle_horizon_seconds)
        #: How long a finished run's outcome may wait for its worker to write the record.
        self.outcome_grace_ms = seconds_to_ms(outcome_grace_seconds)
        #: How old a submission's record gets before a writer's pass writes its row (``claim_unwritten``):
        #: a run that ends within it writes its row once, in its final state.
        self.record_delay_ms = seconds_to_ms(record_delay_seconds)
        self._scripts = {name: client.register_script(source(name)) for name in SCRIPT_NAMES}
        self._transport = transport_for(client, Replication(wait_replicas, seconds_to_ms(wait_timeout_seconds)))
        shards = CLUSTER_INDEX_SHARDS if isinstance(client, RedisCluster) else 1
        self.deadlines = Index(DEADLINE_INDEX, shards)
        self.unwritten_index = Index(UNWRITTEN_INDEX, shards)
        #: Reads whether each grant's message was pushed, and tells a refused push (once per cause).
        self.pushes = Pushes(username(client))
        #: The pools this gate has named among the pools (``keys.POOLS``) that the reaper's pass visits.
        self.named_pools: set[str] = set()

    def _call(self, call: ScriptCall) -> Any:
        """Run one script call; its reply."""
        return self._pipelined([call])[0]

    def _call_and_index(self, call: ScriptCall, key: str) -> list[Any]:
        """Run a script call that may create a holder of ``key``, and index the key, in one round trip."""
        reply: list[Any] = self._pipelined([call], index=key)[0]
        return reply

    def _pipelined(
        self,
        calls: Sequence[ScriptCall],
        *,
        index: str | Sequence[str] | None = None,
        index_within_ms: int | None = None,
        before: Sequence[Command] = (),
        also: Sequence[Command] = (),
    ) -> list[Any]:
        """Run ``calls`` (all of one script, each from its script's builder: see ``calls.py``) in one round trip,
        loading the script if Redis lost it.

        With ``index`` (a key, or several), also move those keys early in the deadline index
        (``ZADD LT``): to when a deadline ``index_within_ms`` from now falls due, by default the
        earliest a new holder's can. ``before`` and ``also``: more commands for the same round
        trip, sent first and last. The replies of the script's calls are returned.
        """
        names = {call.script for call in calls}
        if len(names) > 1:  # a lost script is loaded again for the calls it refused: one script a trip
            raise ValueError(f"one round trip runs one script, not {sorted(names)}")
        script = self._scripts[names.pop()] if names else None
        commands: list[Command] = [*before]
        if script is not None:
            commands += [("EVALSHA", script.sha, len(keys), *keys, *args) for _, keys, args in calls]
        if index is not None:
            indexed = [index] if isinstance(index, str) else index
            commands += index_commands(self.deadlines, indexed, self._deadline_hint_ms(index_within_ms))
        return self._run([*commands, *also], script)[len(before) : len(before) + len(calls)]

    def _run(self, commands: Sequence[Command], script: Script | None = None) -> list[Any]:
        """Send ``commands`` in one round trip and raise the first error reply; if Redis lost ``script``
        (a restart, or a cluster node that never had it), load it and send again the calls it refused."""
        replies = self._transport.round_trip(commands)
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if refused and script is not None:
            script.sha = self.client.script_load(script.script)  # on a cluster, on every master
            for i, reply in zip(refused, self._transport.round_trip([commands[i] for i in refused]), strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _deadline_hint_ms(self, within_ms: int | None = None) -> int:
        # A holder created now has a deadline no earlier than ``within_ms`` from now (by default the
        # shortest a new holder can have), on a clock within a second of this host's; looking early
        # only costs a visit.
        if within_ms is None:
            within_ms = min(self.lease_ms, self.dispatch_timeout_ms)
        return int(time.time() * 1000) + within_ms - 1000

    def _index_unwritten(self, keys: Iterable[str]) -> list[Command]:
        """The commands scoring ``keys`` in the unwritten index (records kept for them) due after the record
        delay, unless due sooner already (``LT``: a key's first record decides, and a writer's claim made
        meanwhile is released keeping the key); none for no key. On this host's clock, as the deadline hint."""
        return index_commands(self.unwritten_index, keys, int(time.time() * 1000) + self.record_delay_ms)

    def _server_time_ms(self) -> int:
        seconds, micros = self.client.time()
        return seconds * 1000 + micros // 1000


#: What every early move of a key in an index takes off its score (ms; a power of two, so exact), so that a
#: move that keeps an earlier score still changes it: the reaper's and the writers' reindex then sees the key
#: touched since they read it, and keeps it (``reindex.lua``).
TOUCH_MS = 2**-10


def index_commands(index: Index, keys: Iterable[str], score: int) -> list[Command]:
    """The commands moving ``keys`` early in ``index``, to ``score`` unless scored earlier already (``ZADD LT``),
    and touching each score (``TOUCH_MS``): a reindex that read the score before it cannot then remove the
    key, or move it later, as if the key were as it read it. One ``ZADD`` per shard that holds any; none for
    no key."""
    by_shard: dict[str, list[EncodableT]] = {}
    touches: list[Command] = []
    for key in dict.fromkeys(keys):
        shard = index.shard_of(key)
        by_shard.setdefault(shard, []).extend((score, key))
        touches.append(("ZINCRBY", shard, -TOUCH_MS, key))
    return [*(("ZADD", shard, "LT", *scored) for shard, scored in by_shard.items()), *touches]


def reindex_calls(index: Index, *, moves: Iterable[tuple[str, float, int]]) -> list[ScriptCall]:
    """``reindex.lua``'s calls moving each (key, score read, next score; -1 = remove) in ``index``: one per shard."""
    by_shard: dict[str, list[EncodableT]] = {}
    for key, seen, next_score in moves:
        # The score as Redis wrote it: a float index score read back whole prints without ".0".
        read = repr(seen) if seen != int(seen) else int(seen)
        by_shard.setdefault(index.shard_of(key), []).extend((key, read, next_score))
    return [ScriptCall("reindex", [shard], args) for shard, args in by_shard.items()]


def grants(key: str, flat: list[Any], pushed: Callable[[Any], bool]) -> list[Grant]:
    """The tickets a script granted, from its reply's ticket, dispatch, message, pushed quadruples
    (``pushed``: the gate's ``pushes.pushed``, which reads the last)."""
    return [
        Grant(key, int(flat[i]), int(flat[i + 1]), flat[i + 2], pushed=pushed(flat[i + 3]))
        for i in range(0, len(flat), 4)
    ]


def text(reply: bytes | str) -> str:
    """A reply as text (the gate's client reads bytes; redis-py's annotations allow either)."""
    return reply.decode() if isinstance(reply, bytes) else reply


def stored_text(reply: bytes | str) -> str:
    """Text the gate keeps for an operator (who stopped a run, and how): anyone may have written it,
    so bytes that are not UTF-8 are read too."""
    return reply.decode(errors="replace") if isinstance(reply, bytes) else reply


def scored(reply: list[Any]) -> list[tuple[bytes | str, float]]:
    """A ``WITHSCORES`` reply as (member, score) pairs: RESP3 sends pairs, RESP2 one flat list."""
    if reply and isinstance(reply[0], list):
        return [(member, float(score)) for member, score in reply]
    return [(reply[i], float(reply[i + 1])) for i in range(0, len(reply), 2)]


def texts(reply: Mapping[bytes | str, bytes | str] | list[bytes | str]) -> dict[str, str]:
    """An ``HGETALL`` reply as a dict of texts: RESP3 sends a map, RESP2 one flat list."""
    if isinstance(reply, Mapping):
        return {text(k): text(v) for k, v in reply.items()}
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply), 2)}
