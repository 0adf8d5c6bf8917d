"""The Celery side: the task class, the producer's submission, a run's start, renewal and end, and
the dispatcher, the one code that publishes a granted ticket or runs it here. ``process`` holds
everything one OS process keeps."""
