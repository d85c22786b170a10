"""Optional integrations; each submodule needs its own extra.

* ``trio_taskvisor.contrib.prometheus``: ``PrometheusSubscriber``, counters, gauges and
  a histogram for Prometheus (``pip install 'trio_taskvisor[prometheus]'``).
* ``trio_taskvisor.contrib.otel``: ``traced`` attempt spans and ``TracingSubscriber``
  for OpenTelemetry (``pip install 'trio_taskvisor[otel]'``).

Nothing here is imported by ``import trio_taskvisor``; import the submodule you use.
"""
