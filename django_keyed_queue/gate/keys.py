"""Every Redis key name the gate uses, built in this one place.

All keys of one logical key share the hash tag ``{<escaped key>}`` so each
script touches a single slot and the gate runs unchanged on Redis Cluster.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

PREFIX = "keyed_queue"

#: ZSET logical key -> server ms when the key may next need the reaper (an :class:`Index`).
DEADLINE_INDEX = f"{PREFIX}:deadlines"

#: ZSET of logical keys holding submissions whose rows are not written yet: score 0, or while a
#: writer has claimed the key, server ms when its claim lapses (an :class:`Index`).
UNWRITTEN_INDEX = f"{PREFIX}:unwritten"

#: How many shards each index has on a Redis Cluster: a few per master of a large cluster.
CLUSTER_INDEX_SHARDS = 16

#: SET of the logical keys an operator paused (its own slot); the live keys page lists them.
PAUSED_KEYS = f"{PREFIX}:paused"

#: SET of the logical keys a failed ticket may block (``on_failure="block"``), listed when it
#: failed and until an operator acts (its own slot); the live keys page lists those still blocked.
BLOCKED_KEYS = f"{PREFIX}:blocked"

#: SET of the logical keys an operator gave a limit or a rate of their own (its own slot); the live
#: keys page lists them.
OVERRIDDEN_KEYS = f"{PREFIX}:overridden"

#: HASH of the deployment's totals for the metrics (counters, histogram buckets and sums), summed over
#: every process; each field names a series and its labels (``process/totals.py``), never a key.
TOTALS = f"{PREFIX}:{{totals}}"

#: HASH task name -> its key template, the label the totals' series carry (the same slot as ``TOTALS``).
TOTALS_TEMPLATES = f"{PREFIX}:{{totals}}:templates"

#: Longest logical key accepted, in characters (before escaping).
MAX_KEY_LENGTH = 200

# Braces would end the hash tag early; "%" is escaped so the mapping is reversible.
_ESCAPES = {"%": "%25", "{": "%7B", "}": "%7D"}
_UNESCAPES = {v: k for k, v in _ESCAPES.items()}


def escape(key: str) -> str:
    return "".join(_ESCAPES.get(ch, ch) for ch in key)


def unescape(escaped: str) -> str:
    out, i = [], 0
    while i < len(escaped):
        token = escaped[i : i + 3]
        if token in _UNESCAPES:
            out.append(_UNESCAPES[token])
            i += 3
        else:
            out.append(escaped[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class KeyNames:
    """The Redis keys holding one logical key's gate state."""

    key: str

    def __post_init__(self) -> None:
        if not self.key:
            # "{}" is no hash tag to Redis Cluster: the names would land in different slots.
            raise ValueError("a gate key must not be empty")

    @cached_property
    def base(self) -> str:
        return f"{PREFIX}:{{{escape(self.key)}}}"

    @property
    def meta(self) -> str:
        """HASH: seq (last ticket), fence (last fencing token), paused, limit, the recent submissions'
        generation, a paced key's last start and interval; kept a minute once the key drains."""
        return f"{self.base}:meta"

    @property
    def queue(self) -> str:
        """LIST of parked tickets, oldest first."""
        return f"{self.base}:queue"

    @property
    def messages(self) -> str:
        """HASH ticket -> task message, kept until the ticket finishes."""
        return f"{self.base}:messages"

    @property
    def wires(self) -> str:
        """HASH ticket -> its message as the broker's queue takes it, a template the grant fills
        (kept only where the gate's Redis is the broker's; see ``messaging/wire.py``)."""
        return f"{self.base}:wires"

    @property
    def holders(self) -> str:
        """HASH ticket -> holder record, one per occupied slot."""
        return f"{self.base}:holders"

    @property
    def outcomes(self) -> str:
        """HASH task id -> the record of a finished run, until the record is written."""
        return f"{self.base}:outcomes"

    @property
    def unwritten(self) -> str:
        """HASH ticket -> a submission's record, kept with its ticket until its row is written."""
        return f"{self.base}:unwritten"

    @property
    def scan_cursors(self) -> str:
        """HASH what is scanned ("unwritten", "outcomes") -> where its last bounded step stopped."""
        return f"{self.base}:scan_cursors"

    @property
    def undelivered(self) -> str:
        """HASH ticket -> how many times a worker dropped its message undelivered (it knew no such task)."""
        return f"{self.base}:undelivered"

    @property
    def joined(self) -> str:
        """ZSET of task ids that joined the queue on arrival, scored by time (duplicate guard)."""
        return f"{self.base}:joined"

    @property
    def recent(self) -> str:
        """HASH task id -> ticket of the key's latest submissions (a retried submit's lookup)."""
        return f"{self.base}:recent"

    @property
    def recent_older(self) -> str:
        """The generation of :attr:`recent` before the current one."""
        return f"{self.base}:recent:older"

    def staged(self, rebuild: str) -> list[str]:
        """The queue (LIST) and messages (HASH) a rebuild, named ``rebuild``, stages before they become the key's."""
        return [f"{self.base}:rebuild:{rebuild}:queue", f"{self.base}:rebuild:{rebuild}:messages"]

    def all(self) -> list[str]:
        return [self.meta, self.queue, self.messages, self.holders, self.wires]


#: SET of the pools tasks have used (its own slot): the reaper returns their expired slots.
POOLS = f"{PREFIX}:pools"


@dataclass(frozen=True)
class PoolNames:
    """The Redis keys holding one pool's state, in a slot of their own (``lua/includes/pool.lua``)."""

    pool: str

    def __post_init__(self) -> None:
        if not self.pool:
            raise ValueError("a pool's name must not be empty")

    @cached_property
    def base(self) -> str:
        return f"{PREFIX}_pool:{{{escape(self.pool)}}}"

    @property
    def running(self) -> str:
        """ZSET member -> server ms until which it holds its slot."""
        return f"{self.base}:running"

    @property
    def ready(self) -> str:
        """ZSET member -> order of arrival: the tickets waiting for a slot."""
        return f"{self.base}:ready"

    @property
    def meta(self) -> str:
        """HASH the limit and interval, an operator's overrides, the rate's last and reserved starts."""
        return f"{self.base}:meta"

    def all(self) -> list[str]:
        return [self.running, self.ready, self.meta]


def pool_member(key: str, ticket: int) -> str:
    """A ticket's member in its pool: "<ticket>|<key>" (a ticket is digits: the first bar splits it)."""
    return f"{ticket}|{key}"


def member_ticket(member: str) -> tuple[str, int]:
    """The key and ticket a pool member names."""
    ticket, key = member.split("|", 1)
    return key, int(ticket)


@dataclass(frozen=True)
class Index:
    """A ZSET of logical keys, in one name on a single server, or split in ``shards`` on a cluster.

    Shard ``i`` has a hash tag whose slot falls in the ``i``-th of equal ranges of the
    cluster's slots, and holds the keys whose slots fall in that range: the shards
    spread over the masters as the keys do, and a key's shard is most often on its
    own master. No script writes an index (it is not in the key's slot).
    """

    name: str
    shards: int = 1

    @cached_property
    def names(self) -> tuple[str, ...]:
        if self.shards == 1:
            return (self.name,)
        return tuple(f"{self.name}:{{{_tag_in_range(i, self.shards)}}}" for i in range(self.shards))

    def shard_of(self, key: str) -> str:
        """The name holding ``key``."""
        if self.shards == 1:
            return self.name
        return self.names[key_slot(KeyNames(key).base.encode()) * self.shards // REDIS_CLUSTER_HASH_SLOTS]


def _tag_in_range(shard: int, shards: int) -> str:
    """The first of "shard.0", "shard.1", ... whose slot is in the ``shard``-th of ``shards`` ranges."""
    for n in itertools.count():
        tag = f"{shard}.{n}"
        if key_slot(tag.encode()) * shards // REDIS_CLUSTER_HASH_SLOTS == shard:
            return tag
    raise AssertionError("unreachable")


def key_from_redis_name(name: str) -> str:
    """The logical key of a name built by :class:`KeyNames`."""
    start, end = name.index("{") + 1, name.index("}")
    return unescape(name[start:end])
