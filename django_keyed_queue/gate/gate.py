"""The gate's one front door: ``Gate``, one atomic Lua call per state transition of a ticket.

``Gate`` holds no code of its own: each concern lives in a module of its own, as one class of
calls, and ``Gate`` is all of them together, so that callers see one object. Every class
derives from :class:`~.base.GateBase`, whose runner sends every script call; the arguments of
each script are built by its transition's module beside it, or by the module of the concern that
sends it (``calls.py`` says which).

=================  =========================================================================
tickets.py         a ticket's life: submit, start, renew, retry, requeue, finish, cancel, ...
operator.py        pause and resume, the paused and blocked keys, refused joins
unwritten.py       records kept until the database has them
reaping.py         the deadline index, the reaper, releases, rebuilds
pools.py           pools: a limit and a rate shared by every key and worker (the reaper's base)
totals.py          the deployment's totals the metrics read
inspection.py      snapshots, and the holder record's one parser in Python
listing.py         which keys have work: the deadline index read earliest first, searched
base.py            the client, the durations, the indexes, the one script runner
calls.py           a script call, and its arguments' encoding on the wire
=================  =========================================================================
"""

from __future__ import annotations

from .inspection import InspectCalls
from .listing import ListingCalls
from .operator import OperatorCalls
from .reaping import ReaperCalls
from .tickets import TicketCalls
from .totals import TotalsCalls
from .transport import NotSent, ReplicasBehind
from .unwritten import UnwrittenCalls


class Gate(TicketCalls, OperatorCalls, UnwrittenCalls, ReaperCalls, ListingCalls, InspectCalls, TotalsCalls):
    """Per-key FIFO of tickets in Redis; at most ``limit`` tickets of a key hold a slot.

    Every method is one script call (one round trip) unless it says otherwise.
    Durations are seconds at this API and milliseconds inside Redis. Made with
    a Redis client (of one server, or of a Redis Cluster) and the durations
    ``GateBase.__init__`` takes: lease, dispatch timeout, idle horizon, outcome
    grace, and the replicas each write waits for.
    """


__all__ = ["Gate", "NotSent", "ReplicasBehind"]
