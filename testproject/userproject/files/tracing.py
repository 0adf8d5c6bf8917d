"""OpenTelemetry in a worker's child processes, set up as its Celery instrumentation's docs say (at
``worker_process_init``): each span ended is appended to ``spans.jsonl`` in the project's directory.

The tracing tests copy this module into the project's ``mysite/`` and import it from ``mysite/celery.py``;
the producers stay untraced.
"""

import json
from pathlib import Path

from celery.signals import worker_process_init

SPANS = Path(__file__).resolve().parents[1] / "spans.jsonl"


@worker_process_init.connect(weak=False)
def trace_this_process(**_: object) -> None:
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider()
    exporter = ConsoleSpanExporter(out=open(SPANS, "a"), formatter=_line)  # noqa: SIM115 (the process's own)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()


def _line(span) -> str:
    context, parent = span.get_span_context(), span.parent
    return json.dumps({
        "name": span.name,
        "task_id": span.attributes.get("messaging.message.id"),
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
        "parent_trace_id": format(parent.trace_id, "032x") if parent else None,
        "parent_id": format(parent.span_id, "016x") if parent else None,
    }) + "\n"  # fmt: skip
