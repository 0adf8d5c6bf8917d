"""What a script's reply says of its push of a granted ticket's message onto the broker's queue.

Where the gate's Redis is the broker's, the script that grants a ticket also pushes its message
(``common.lua``'s ``push_granted``), and says for each grant (``push_reply``): 1, pushed; 0, not
(no template, no queue bound); or the command Redis refused, its key and Redis' error. The usual
refusal is an ACL: the gate and the broker connect as two Redis users, and the gate's may not
write the broker's queues or read its bindings. A refused grant is published by its caller
through kombu, as any grant the gate did not push: nothing is lost, but the grant and its
message are two steps again. :class:`Pushes` reads the field, and says so once per process (per
cause) at WARNING, with the cause and the fix.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

#: Where the ACL rules of each set-up are given.
RULES_DOC = "docs/deployment.md, 'Redis ACL users'"


class Pushes:
    """Reads the ``pushed`` field of a gate's replies; one per gate, so one per process."""

    def __init__(self, username: str | None) -> None:
        #: The gate's Redis user, as it connects (None: Redis' ``default``).
        self.username = username or "default"
        self._told: set[str] = set()

    def pushed(self, field: Any) -> bool:
        """Whether the script pushed the grant's message; a refusal is told (once per cause)."""
        if field == 1:
            return True
        if isinstance(field, (bytes, str)) and field:
            self.refused(field.decode(errors="replace") if isinstance(field, bytes) else field)
        return False

    def refused(self, reply: str) -> None:
        command, key, error = (reply.split("\0", 2) + ["", ""])[:3]
        cause = "acl" if is_acl_refusal(error) else (error.split(" ", 1)[0] or "error")
        if cause in self._told:
            logger.debug("the gate's push was refused again (%s %r: %s): published in two steps", command, key, error)
            return
        self._told.add(cause)
        refused = f"{command} {key!r}: {error}"
        if cause == "acl":
            if command == "SMEMBERS":  # the bindings are read first: the queues are not known yet
                right, rule = "read the exchange's bindings", f"%R~{key} %W~<each queue>*"
            else:
                right, rule = "write the queue", f"%W~{key}* %R~_kombu.binding.*"
            logger.warning(
                "keyed queue: Redis refused the gate's push of a granted task's message onto Celery's queue, "
                "an ACL refusal (NOPERM; %s): the gate's Redis user %r may not %s. Each grant the gate "
                "cannot push is published in a second step instead, through kombu as the broker's user: nothing "
                "is lost, but a process that dies between the two leaves its task to the reaper. To fix it, let "
                "the gate's user push (ACL SETUSER %s %s, and in your ACL file; %s gives the rules), or connect "
                "the gate and the broker as one Redis user. (Said once per process.)",
                refused, self.username, right, self.username, rule, RULES_DOC,
            )  # fmt: skip
        else:
            logger.warning(
                "keyed queue: Redis refused the gate's push of a granted task's message onto Celery's queue "
                "(%s). Each grant the gate cannot push is published in a second step instead, through kombu; "
                "one the broker refuses too is published again by the reaper. (Said once per process.)",
                refused,
            )


def is_acl_refusal(error: str) -> bool:
    """Whether Redis' error is an ACL's refusal: ``NOPERM ...``, or inside a script on Redis 7.0
    "The user executing the script can't access at least one of the keys ...")."""
    return error.startswith("NOPERM") or "user executing the script can't" in error or "no permissions" in error


def username(client: Any) -> str | None:
    """The Redis user a client of one server connects as (None: ``default``, or a cluster's client)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    name = kwargs.get("username")
    return str(name) if name else None
