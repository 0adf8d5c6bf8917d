"""The keyed task: ``@keyed_serial_task`` and its Celery task class, which hands a submission to the
producer's side and a run to the worker's side."""
