"""The operator's actions: each one's rules (what it refuses, what it says, what it writes) in one
function that every surface calls (the admin's pages, the live keys page, the commands, the API), and
recovery, the one home of every repair, which the reaper calls too.

Each action logs what it did at INFO to ``AUDIT_LOGGER``, the audit trail.
"""

#: The logger of every operator action and of the reaper's repairs (the audit trail).
AUDIT_LOGGER = "django_keyed_queue.ops.actions"
