"""The operator's side: recovery (the one home of every repair), the reaper, the admin, the live
keys page, the timeline, the health view, Celery's upkeep tasks and the signal wiring."""
