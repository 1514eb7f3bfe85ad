"""What operators watch, as Prometheus metrics through ``ray.serve.metrics``: each replica
records, and Ray's metrics agent on its node serves them at ``http://NODE:<metrics_export_port>/metrics``
(Ray adds the ``ray_`` prefix and the ``application``, ``deployment`` and ``replica`` tags).
``deploy/grafana/canopy.json`` is a dashboard over them.

- ``canopy_requests_total{route, status}`` and ``canopy_request_seconds{route}``: every HTTP
  request of the ingress; ``canopy_errors_total{route, reason}``: every error answer, by the
  ``reason`` of its JSON body (``overloaded``, ``replica_failed``, ``timeout``, ``invalid_request``...).
- ``canopy_stage_seconds{route, stage}``: the ingress's timings of each request's stages
  (``encode_query`` and ``compress`` for /v1/compress; the pipeline's for /v1/answer).
- ``canopy_tokens_total{route, side}`` (``before`` / ``after`` compression) and
  ``canopy_compression_ratio{route}`` (after / before, per request).
- ``canopy_nodes_total{source}``: node vectors the Refiner used, by where they came from
  (``encoded`` by the node encoder, the index's node ``store``, the vector ``cache``), and
  ``canopy_vector_cache_hit_rate``: the Refiner's cache hits over lookups since it started.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

ROUTES = ("/v1/compress", "/v1/answer", "/v1/chat/completions", "/v1/models", "/v1/config", "/healthz")
SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
RATIO = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


@cache
def metrics() -> SimpleNamespace:
    """The metric objects, made once per replica process (on first use, inside the replica)."""
    from ray.serve.metrics import Counter, Gauge, Histogram

    return SimpleNamespace(
        requests=Counter("canopy_requests", "HTTP requests by route and status", tag_keys=("route", "status")),
        errors=Counter("canopy_errors", "error answers by route and JSON reason", tag_keys=("route", "reason")),
        latency=Histogram("canopy_request_seconds", "request latency", boundaries=SECONDS, tag_keys=("route",)),
        stage=Histogram("canopy_stage_seconds", "latency of each stage of a request", boundaries=SECONDS,
                        tag_keys=("route", "stage")),
        tokens=Counter("canopy_tokens", "reader tokens before and after compression", tag_keys=("route", "side")),
        ratio=Histogram("canopy_compression_ratio", "tokens after / before, per request", boundaries=RATIO,
                        tag_keys=("route",)),
        nodes=Counter("canopy_nodes", "node vectors used, by source: encoded, store, cache", tag_keys=("source",)),
        cache_hit_rate=Gauge("canopy_vector_cache_hit_rate", "vector cache hits / lookups since the replica began"),
    )


def route_of(path: str) -> str:
    """A request path as one of the ingress's routes (whatever the application's prefix), so
    that a path with an id in it (``/v1/models/{id}``) adds no new series."""
    return next((r for r in ROUTES if r in path), "other")


def record_request(path: str, status: int, seconds: float) -> None:
    route = route_of(path)
    m = metrics()
    m.requests.inc(tags={"route": route, "status": str(status)})
    m.latency.observe(seconds, tags={"route": route})


def record_error(path: str, reason: str) -> None:
    metrics().errors.inc(tags={"route": route_of(path), "reason": reason})


def record_result(route: str, tokens_before: int, tokens_after: int, timings: dict[str, float]) -> None:
    """A request's compression and stage timings (``route``: ``/v1/compress`` or ``/v1/answer``)."""
    m = metrics()
    m.tokens.inc(tokens_before, tags={"route": route, "side": "before"})
    m.tokens.inc(tokens_after, tags={"route": route, "side": "after"})
    if tokens_before:
        m.ratio.observe(tokens_after / tokens_before, tags={"route": route})
    for stage, seconds in timings.items():
        m.stage.observe(float(seconds), tags={"route": route, "stage": stage})


class NodeSources:
    """The Refiner's node-vector counts (cumulative, over its compressors) turned into counter
    increments: each :meth:`export` adds what grew since the last one, so requests that overlap
    on the replica's event loop are counted once each."""

    SOURCES = ("encoded", "store", "cache")

    def __init__(self):
        self.seen = dict.fromkeys(self.SOURCES, 0)

    def export(self, totals: dict[str, int], cache_stats: dict | None) -> None:
        m = metrics()
        for source in self.SOURCES:
            grew = totals.get(source, 0) - self.seen[source]
            if grew > 0:
                m.nodes.inc(grew, tags={"source": source})
                self.seen[source] += grew
        if cache_stats:
            lookups = cache_stats["hits"] + cache_stats["misses"]
            if lookups:
                m.cache_hit_rate.set(cache_stats["hits"] / lookups)
