"""What the operator sees: the admin's pages (the task list, a task's page, the live keys page and the
timeline), why a task waits (``explain``), the health and metrics views. Its buttons call the actions."""
