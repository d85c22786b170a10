"""Tracing: one OpenTelemetry span per attempt, a child of the submitter's span.

Needs the ``otel`` extra (``pip install 'trio_taskvisor[otel]'``: the API only) and,
to see spans, an SDK: this example uses ``opentelemetry-sdk`` with an in-memory
exporter. In a service, configure your exporter (OTLP, ...) instead.

``traced(fn)`` wraps a task function so each attempt opens a span with the task's
name, id, attempt, slot and result. The supervisor runs every attempt in a copy of the
context captured at ``add`` time, so the attempt spans are children of the span that
was current when the work was added, even for retries long after the request span has
ended. ``TracingSubscriber`` adds the supervisor's decisions to those spans: the backoff
before a retry, and the moment a stop was forced.
"""

import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trio_taskvisor import (
    BackoffPolicy,
    GraceExceededError,
    SupervisorConfig,
    TaskSpec,
    current_context,
    open_supervisor,
)
from trio_taskvisor.contrib.otel import TracingSubscriber, traced

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("examples.tracing")


async def sync_tenant(tenant: str) -> str:
    if current_context().attempt == 1:
        raise ConnectionError(f"{tenant}: upstream timed out")
    with tracer.start_as_current_span("apply changes"):  # a child of the attempt span
        await trio.sleep(0.01)
    return f"{tenant} synced"


async def export_audit_log() -> None:
    with current_context().defer_cancel():  # ignores the soft stop: forced at grace
        await trio.sleep(5)


def show(span: ReadableSpan, children: dict[int, list[ReadableSpan]], depth: int = 0) -> None:
    attributes = span.attributes or {}
    details = [
        f"{key.removeprefix('taskvisor.')}={attributes[key]}"
        for key in ("taskvisor.attempt.number", "taskvisor.attempt.result")
        if key in attributes
    ]
    details += [f"event:{event.name}" for event in span.events]
    if span.status.status_code.name == "ERROR":
        details.append(f"status=ERROR({span.status.description})")
    print(f"{'  ' * depth}{span.name} {' '.join(details)}".rstrip())
    assert span.context is not None
    for child in children.get(span.context.span_id, []):
        show(child, children, depth + 1)


async def main() -> None:
    config = SupervisorConfig(grace=0.1)
    try:
        async with open_supervisor(config, subscribers=[TracingSubscriber()]) as sup:
            with tracer.start_as_current_span("POST /tenants/acme/sync"):
                spec = TaskSpec.restartable(
                    "sync-acme",
                    traced(sync_tenant),
                    "acme",
                    backoff=BackoffPolicy.constant(0.05),
                )
                waiter = await sup.add(spec)
            print((await waiter.wait()).value)
            with tracer.start_as_current_span("nightly export"):
                await sup.add(TaskSpec.once("export", traced(export_audit_log)))
            await trio.sleep(0.05)
    except GraceExceededError as exc:
        print(f"shutdown: {exc}")

    spans = sorted(exporter.get_finished_spans(), key=lambda span: span.start_time or 0)
    children: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.parent is not None:
            children.setdefault(span.parent.span_id, []).append(span)
    for span in spans:
        if span.parent is None:
            show(span, children)


if __name__ == "__main__":
    trio.run(main)
