"""Faults against a real Serve application on 127.0.0.1: the replica that encodes nodes (the
Refiner, as configs/cpu.yaml serves) killed with SIGKILL under load, a burst past capacity, and a
dead LLM endpoint. The application is this module's own ("faults", at /faults, small queues, the
LLM an ``openai`` endpoint on a closed port), beside the package's when that one runs. Timing
bounds are generous hang bounds only. (A NodeEncoder deployment's replicas are killed with their
node in test_serve_node_loss.py.)
"""

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from faults import Reply, kill_under_load, load, merged, probe_body, sections, tally  # noqa: E402

from tests.serve.conftest import app_beside, free_port  # noqa: E402

APP = "faults"
HANG_S = 120  # no request may take longer, whatever happens
QUESTION = "When was the Eiffel Tower built?"


@pytest.fixture(scope="module")
def faults(cfg):
    """This module's application; its URL. Serve is started here unless the package's runs."""
    mine = cfg.override(serve={"replica_cpus": 0.05, "refiner_limits": (4, 4), "retry_after_s": 3,
                               "call_timeout_s": 60, "request_timeout_s": 100},
                        llm={"backend": "openai", "url": f"http://127.0.0.1:{free_port()}/v1",
                             "model": "stand-in", "timeout_s": 5})
    yield from app_beside(cfg, mine, APP)


def _compress_bodies(n: int, tag: str) -> list[str]:
    """Distinct requests (no vector cache answers them): each needs the node encoder."""
    return [json.dumps({"query": f"When was tower {i} built?", "items": [
        {"id": "p", "modality": "text", "title": f"Tower {i}",
         "sentences": [f"Tower {i} ({tag}) stands in town {i}.", f"It was built in {1800 + i}.",
                       f"It is {100 + i} metres tall.", "Visitors climb it every day.",
                       f"Its architect was Builder {i}."]}]}) for i in range(n)]


def _is_json_error(r) -> bool:
    return r.json_reason is not None


@pytest.mark.integration
def test_a_dead_llm_still_answers_with_the_evidence_and_a_reason(faults):
    bodies = [json.dumps({"question": QUESTION})] * 4
    replies = asyncio.run(load(faults + "/v1/answer", bodies, 2, HANG_S))
    assert all(r.status in (200, 503) for r in replies), [(r.status, r.body) for r in replies]
    assert all(_is_json_error(r) for r in replies if r.status == 503)
    answered = [r.body for r in replies if r.status == 200]
    assert answered  # nothing was overloaded here
    for body in answered:
        assert body["answer"] is None and body["answer_error"].startswith("connection:")
        assert body["evidence"] and any("1889" in e["text"] for e in body["evidence"])
        # the critic failing counts as "sufficient": one round, then the reader, both counted
        assert body["rounds"] == 1 and body["llm_failures"]["critic"] == 1 and body["llm_failures"]["reader"] == 1


@pytest.mark.integration
def test_a_burst_past_capacity_gets_only_200_or_json_429_503(faults):
    """300 requests at once, far past ``serve.max_inflight`` (12): every one shed is shed by the
    Ingress, as JSON with a reason. Were the Ingress's own Serve queue bounded, requests still
    waiting to be assigned to it would fill that queue first, and Serve's proxy would answer them
    with its text/plain 503."""
    replies = asyncio.run(load(faults + "/v1/compress", _compress_bodies(300, "burst"), 300, HANG_S))
    statuses = Counter(r.status for r in replies)
    assert set(statuses) <= {200, 429, 503}, statuses  # no hang ("hung"), reset or 500
    assert statuses[200] >= 1 and statuses[429] + statuses[503] >= 100, statuses  # capacity was passed
    shed = [r for r in replies if r.status != 200]
    not_json = Counter((r.status, r.content_type) for r in shed if r.json_reason is None)
    assert not not_json, not_json
    assert all(r.json_reason == "overloaded" and r.retry_after == "3" for r in shed)


@pytest.mark.integration
def test_killing_the_replica_that_encodes_nodes_fails_at_most_the_requests_in_flight(faults):
    # 3 requests at a time and the probe: as many as the Refiner's queue holds (refiner_limits[1]),
    # so that none is shed while the replicas look busy (Serve's view of them lags their replies)
    replies, at = asyncio.run(kill_under_load(faults + "/v1/compress", _compress_bodies(16, "kill"), 3, 4,
                                              "Refiner", probe_body, HANG_S, app=APP, limit_s=60))
    in_flight = [r for r in replies if r.sent < at["kill"] < r.done]
    failed = [r for r in replies if r.status != 200]
    assert all(any(r is f for r in in_flight) for f in failed), [(f.status, f.json_reason) for f in failed]
    assert all(isinstance(f.status, int) and 500 <= f.status < 600 and _is_json_error(f) for f in failed)
    # Serve restarted the replica: a new request (sent again and again) succeeded within 60 s of the kill
    assert at["recover"] is not None and at["restarted"] is not None


# ---------------------------------------------------------------- the pieces, without Serve

def test_faults_map_to_json_errors_with_reasons():
    from ray.exceptions import ActorDiedError, RayTaskError
    from ray.serve.exceptions import BackPressureError

    from canopy_ray.core.errors import ItemError
    from canopy_ray.serve.ingress import fault_error

    full = fault_error("compress", BackPressureError(num_queued_requests=8, max_queued_requests=8), 2.0, 429)
    assert (full.status, full.reason, full.headers, full.retryable) == (429, "overloaded", {"Retry-After": "2"},
                                                                        False)
    # a Refiner whose NodeEncoder died: the ingress sees RayTaskError(ActorDiedError)
    died = RayTaskError("compress", "tb", ActorDiedError()).as_instanceof_cause()
    err = fault_error("compress", died, 2.0)
    assert (err.status, err.reason, err.retryable) == (503, "replica_failed", True)
    assert fault_error("encode", ActorDiedError(), 2.0).retryable
    assert fault_error("fetch", TimeoutError(), 2.0).status == 504
    bad = RayTaskError("compress", "tb", ItemError("missing_media", "no such file")).as_instanceof_cause()
    assert (fault_error("compress", bad, 2.0).status, fault_error("compress", bad, 2.0).reason) == (422,
                                                                                                  "missing_media")
    bug = RayTaskError("compress", "tb", ZeroDivisionError("x")).as_instanceof_cause()
    assert (fault_error("compress", bug, 2.0).status, fault_error("compress", bug, 2.0).reason) == (500,
                                                                                                  "internal_error")
    with pytest.raises(KeyError):  # not a fault of another deployment: a bug, for the JSON 500 handler
        fault_error("compress", KeyError("x"), 2.0)


def test_the_faults_table_counts_answers_that_are_not_json_and_keeps_the_parts_not_run():
    json_503 = Reply(503, 0.0, 0.1, "overloaded", "2", None, "application/json")
    proxy_503 = Reply(503, 0.0, 0.1, None, "2", None, "text/plain; charset=utf-8")  # Serve's proxy
    t = tally([Reply(200, 0.0, 1.0, None, None, {}), json_503, proxy_503, Reply("hung", 0.0, 9.0, None, None)])
    assert (t["ok"], t["failed"], t["not_json"], t["hung"]) == (1, {"503": 2, "hung": 1}, 2, 1)
    assert t["not_json_types"] == {"text/plain; charset=utf-8": 1}  # a hang has no content type
    llm = {"fault": "LLM down", **tally([json_503]), "recover_s": 0.1, "null_answers": 0, "with_evidence": 0,
           "llm_failures": 0, "answer_errors": {}}
    first = merged("", sections({"llm": [llm]}, "Measured by A."))
    again = {**llm, "fault": "LLM down again"}
    second = merged(first, sections({"llm": [again]}, "Measured by B."))
    assert "LLM down again" in second and "Measured by A." not in second
    kill = {"fault": "kill", "victim": "Refiner", **tally([json_503]), "recover_s": 1.0, "in_flight": 1, "retried": 1,
            "restarted_s": 0.5, "p99_before": None, "p99_in_flight": None}
    third = merged(second, sections({"kill": kill}, "Measured by C."))
    assert "Measured by B." in third and "Measured by C." in third  # the llm section kept
    assert third.index("## A replica killed") < third.index("## A dead or misbehaving LLM")


def test_model_health_probes_after_a_failure_and_when_idle():
    from canopy_ray.serve.deployments import ModelHealth

    broken = {"now": False}

    def probe():
        if broken["now"]:
            raise RuntimeError("weights are gone")

    health = ModelHealth(probe, idle_s=3600)
    health.check()  # busy and healthy: nothing to probe
    with pytest.raises(ValueError):
        health.run(lambda: (_ for _ in ()).throw(ValueError("odd input")))
    assert health.due()
    health.check()  # the probe passes: it was the input, not the model
    assert health.error is None and not health.due()
    broken["now"] = True
    with pytest.raises(OSError):
        health.run(lambda: (_ for _ in ()).throw(OSError("device lost")))
    with pytest.raises(RuntimeError, match="health probe failed.*device lost"):
        health.check()  # Serve marks the replica unhealthy and replaces it
    idle = ModelHealth(probe, idle_s=0.0)
    time.sleep(0.01)
    assert idle.due()
