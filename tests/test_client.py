"""``canopy_ray.Client`` without a server: fates from kept spans, errors, the token report.
(Against the served app: tests/serve/test_client_served.py.)"""

import random

import httpx
import pytest

import canopy_ray
from canopy_ray.client import Client, ServiceError, _fates
from canopy_ray.compressor import chosen, token_report
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import TextItem
from canopy_ray.core.refine import decisions, refine


def test_client_is_exported_lazily():
    assert canopy_ray.Client is Client and canopy_ray.token_report is token_report
    with pytest.raises(AttributeError):
        canopy_ray.Nope  # noqa: B018
    with pytest.raises(ValueError, match="http"):
        Client("127.0.0.1:8000")


@pytest.mark.parametrize("n,branching", [(1, 2), (5, 2), (7, 3), (12, 2), (16, 4)])
def test_fates_from_kept_spans_are_refinements_decisions(n, branching):
    rng = random.Random(n * 10 + branching)
    tree = build_tree(TextItem("x", "", tuple(f"s{i}." for i in range(n))), branching=branching)
    for _ in range(30):
        scores = {node.span: rng.random() for node in tree.nodes()}
        fate = decisions(tree.root, scores)
        assert _fates(tree, [s for s, d in fate.items() if d == "kept"]) == fate


def test_service_error_reads_both_error_shapes():
    canopy = ServiceError.from_response(httpx.Response(413, json={"error": {"reason": "too_many_items",
                                                                             "message": "9 items"}}))
    assert (canopy.status, canopy.reason, canopy.message) == (413, "too_many_items", "9 items")
    oai = ServiceError.from_response(httpx.Response(400, json={"error": {"message": "bad", "type": "x",
                                                                          "code": "malformed_json", "param": None}}))
    assert (oai.reason, oai.message) == ("malformed_json", "bad")
    plain = ServiceError.from_response(httpx.Response(502, text="Bad Gateway"))
    assert plain.status == 502 and plain.message == "Bad Gateway"


def test_token_report_is_llmlinguas():
    tree = build_tree(TextItem("x", "", ("One two three.", "Four five six.")), branching=2)
    scores = {(0, 2): 0.5, (0, 1): 0.9, (1, 2): 0.1}
    results = [chosen(tree, scores, refine(tree.root, scores), lambda text: len(text.split()))] * 2
    assert token_report(results) == {"origin_tokens": 12, "compressed_tokens": 6, "ratio": 2.0}
    assert token_report([]) == {"origin_tokens": 0, "compressed_tokens": 0, "ratio": 0.0}
