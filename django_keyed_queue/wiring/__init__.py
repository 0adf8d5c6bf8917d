"""Wiring only: Celery's and Django's signals to the code that acts on them, the reaper thread every
worker's main process runs, and the upkeep tasks for a beat schedule."""
