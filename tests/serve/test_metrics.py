"""Operators' metrics on Ray's Prometheus endpoint: after real requests to the real application
(this package's, on 127.0.0.1), the metrics agent of the node serves every ``canopy_*`` series
:mod:`canopy_ray.serve.metrics` defines, with the values those requests put there."""

import json
import re
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
BODY = {"query": "When was the Eiffel Tower built?", "items": [
    {"id": "m1", "modality": "text", "title": "Metric tower",
     "sentences": ["The metric tower stands in a test town.", "It was built in 1901.", "It is 90 metres tall.",
                   "Its architect was a surveyor."]}]}


def _scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text


def _value(text: str, name: str, **tags) -> float | None:
    """The sum of the samples of ``name`` whose labels include ``tags``."""
    total, found = 0.0, False
    for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(labels.get(k) == v for k, v in tags.items()):
            total += float(m.group(2))
            found = True
    return total if found else None


@pytest.mark.integration
def test_metrics_reach_the_prometheus_endpoint(url):
    import ray

    ok = [httpx.post(url + "/v1/compress", json=BODY, timeout=120) for _ in range(2)]  # the second: from the cache
    assert [r.status_code for r in ok] == [200, 200], ok[0].text
    bad = httpx.post(url + "/v1/compress", content=b"{not json", headers={"content-type": "application/json"},
                     timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["reason"] == "malformed_json"
    before = sum(r.json()["tokens_before"] for r in ok)
    after = sum(r.json()["tokens_after"] for r in ok)

    port = ray._private.worker.global_worker.node.metrics_export_port  # this node's metrics agent
    want = {  # series -> the least value these requests give it
        ("ray_canopy_requests_total", (("route", "/v1/compress"), ("status", "200"))): 2,
        ("ray_canopy_requests_total", (("route", "/v1/compress"), ("status", "400"))): 1,
        ("ray_canopy_errors_total", (("route", "/v1/compress"), ("reason", "malformed_json"))): 1,
        ("ray_canopy_tokens_total", (("route", "/v1/compress"), ("side", "before"))): before,
        ("ray_canopy_tokens_total", (("route", "/v1/compress"), ("side", "after"))): after,
        ("ray_canopy_compression_ratio_count", (("route", "/v1/compress"),)): 2,
        ("ray_canopy_request_seconds_count", (("route", "/v1/compress"),)): 3,
        ("ray_canopy_stage_seconds_count", (("route", "/v1/compress"), ("stage", "compress"))): 2,
        ("ray_canopy_stage_seconds_count", (("route", "/v1/compress"), ("stage", "encode_query"))): 2,
        ("ray_canopy_nodes_total", (("source", "encoded"),)): 1,
        ("ray_canopy_nodes_total", (("source", "cache"),)): 1,
        # this application's replica: the second request's nodes were cache hits
        ("ray_canopy_vector_cache_hit_rate", (("application", "canopy"),)): 1e-9,
    }
    deadline, missing = time.monotonic() + 90, want  # the agent exports every few seconds
    while missing and time.monotonic() < deadline:
        text = _scrape(port)
        missing = {k: v for k, v in want.items()
                   if (got := _value(text, k[0], **dict(k[1]))) is None or got < v}
        if missing:
            # a gauge not set again ages out of the agent within seconds: set it again
            httpx.post(url + "/v1/compress", json=BODY, timeout=120).raise_for_status()
            time.sleep(2)
    assert not missing, f"missing or short on :{port}/metrics: {missing}"
    # after / before per request: the mean over every /v1/compress the shared app has served
    ratio_sum = _value(text, "ray_canopy_compression_ratio_sum", route="/v1/compress")
    ratio_count = _value(text, "ray_canopy_compression_ratio_count", route="/v1/compress")
    assert ratio_count >= 2 and 0 < ratio_sum <= ratio_count * 1.0 + 1e-9


def test_the_grafana_dashboard_queries_the_exported_series():
    from canopy_ray.serve import metrics

    board = json.loads((ROOT / "deploy" / "grafana" / "canopy.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    names = {"canopy_requests_total", "canopy_errors_total", "canopy_request_seconds_bucket",
             "canopy_stage_seconds_bucket", "canopy_tokens_total", "canopy_compression_ratio_bucket",
             "canopy_nodes_total", "canopy_vector_cache_hit_rate"}
    for name in names:
        assert any(f"ray_{name}" in e for e in exprs), name
    source = Path(metrics.__file__).read_text()
    for name in names:  # each queried series is one the module defines
        base = re.sub(r"_(total|bucket)$", "", name)
        assert f'"{base}"' in source, base


def test_routes_are_tagged_without_ids():
    from canopy_ray.serve.metrics import route_of

    assert route_of("/v1/compress") == "/v1/compress"
    assert route_of("/faults/v1/answer") == "/v1/answer"  # an application's route prefix
    assert route_of("/v1/models/some/model-id") == "/v1/models"
    assert route_of("/nope") == "other"
