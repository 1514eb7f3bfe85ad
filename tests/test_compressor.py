import json

import numpy as np
import pytest

from canopy_ray import refine
from canopy_ray.cli import main
from canopy_ray.compressor import Compressor, compress_tree, format_forest
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import parse_item

TEXT = parse_item({"id": "p", "modality": "text", "title": "Tinted Windows",
                   "sentences": ["Tinted Windows is an American rock supergroup.",
                                 "It formed in New York City in 2008.",
                                 "Their first performance was in Tulsa, Oklahoma.",
                                 "The drummer also played in Cheap Trick."]})


def test_compress_tree_scores_by_dot_product_and_refines():
    tree = build_tree(TEXT)  # (0,4) (0,2) (0,1) (1,2) (2,4) (2,3) (3,4)
    q = np.array([1.0, 0.0])
    angles = [0.5, 0.2, 0.0, 0.0, 0.8, 0.9, 0.1]  # node scores in pre-order
    vecs = np.array([[a, np.sqrt(1 - a * a)] for a in angles])
    r = compress_tree(q, tree, vecs)
    assert r.scores[(2, 4)] == pytest.approx(0.8)
    assert r.kept == [(2, 3)] == refine(tree.root, r.scores)
    assert r.evidence.text == "Tinted Windows: Their first performance was in Tulsa, Oklahoma."
    assert r.tokens_after < r.tokens_before
    assert [n["decision"] for n in r.nodes()] == ["split", "dropped", "dropped", "dropped", "split", "kept", "dropped"]
    forest = format_forest(r)
    assert "[KEEP ] 2-3 +0.9000" in forest and "0-1" not in forest  # dropped subtrees stay folded


@pytest.mark.integration
def test_minilm_keeps_the_answer_sentence(minilm):
    comp = Compressor(minilm)
    (r,) = comp.compress("Where did Tinted Windows first perform?", [TEXT])
    assert any(a <= 2 < b for a, b in r.kept)
    assert set(r.scores) == {n.span for n in r.tree.nodes()}


@pytest.mark.integration
def test_cached_node_vectors_skip_the_encoder(minilm):
    tree = build_tree(TEXT)
    cached = Compressor(minilm).node_vectors([tree])[0]

    class Store:  # the node store's interface over vectors computed above
        def lookup(self, item_id):
            return {n.span: v for n, v in zip(tree.nodes(), cached)} if item_id == TEXT.id else None

        def usable_for(self, encoder):
            return True

    class Refuses:
        def encode_nodes(self, nodes):
            raise AssertionError("a cache hit must not encode")

    comp = Compressor(Refuses(), node_store=Store())
    q = minilm.encode_queries(["Where did Tinted Windows first perform?"])[0]
    (hit,) = comp.compress_items(q, [TEXT])
    (miss,) = Compressor(minilm).compress("Where did Tinted Windows first perform?", [TEXT])
    assert hit.kept == miss.kept
    assert hit.scores == pytest.approx(miss.scores)
    assert comp.stats == {"hits": len(tree.nodes()), "misses": 0}


@pytest.mark.integration
def test_cli_compress_json(tmp_path, capsys):
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "p", "modality": "text", "title": "T",
                                 "text": "Paris is in France. Berlin is in Germany."}) + "\n{bad\n")
    assert main(["compress", "--query", "capital of Germany", "--items", str(items), "--json"]) == 0
    out = capsys.readouterr()
    (res,) = json.loads(out.out)
    assert res["id"] == "p" and "skipped line 2" in out.err
    assert {n["decision"] for n in res["nodes"]} <= {"kept", "split", "dropped", "within"}


def test_flat_mode_keeps_the_m_best_leaves_and_none_keeps_items_whole():
    from canopy_ray.compressor import flat_tree

    tree = build_tree(TEXT)
    q = np.array([1.0, 0.0])
    angles = [0.5, 0.2, 0.0, 0.3, 0.8, 0.9, 0.1]
    vecs = np.array([[a, np.sqrt(1 - a * a)] for a in angles])
    r = flat_tree(q, tree, vecs, m=2)
    assert r.kept == [(1, 2), (2, 3)]
    assert r.evidence.text == ("Tinted Windows: It formed in New York City in 2008. "
                               "Their first performance was in Tulsa, Oklahoma.")
