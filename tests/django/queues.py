"""The django tier's broker queue."""

#: Submissions in this tier go to a queue no worker consumes, so the test can inspect the broker.
QUEUE = "keyed-queue-tests-unconsumed"
