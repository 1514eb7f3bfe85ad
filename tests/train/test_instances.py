from canopy_ray.core.evidence import node_text
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Gold, Question, TextItem
from canopy_ray.core.splits import GoldItem
from canopy_ray.train.instances import build_instances, instances_for


def gold_item(n, leaves, title="T"):
    item = TextItem("i", title, tuple(f"Sentence {k}." for k in range(n)))
    q = Question("q", "what?", (), (Gold("i", tuple(leaves)),))
    return GoldItem("hotpotqa", q, build_tree(item), frozenset(leaves))


def spans_pairs(inst):
    return inst.spans, {(inst.spans[a], inst.spans[b]) for a, b in inst.pairs}


def test_fully_gold_root_beats_its_children():
    (inst,) = instances_for(gold_item(4, {0, 1, 2, 3}))
    spans, pairs = spans_pairs(inst)
    assert inst.fully_gold and spans == ((0, 4), (0, 2), (2, 4))
    assert pairs == {((0, 4), (0, 2)), ((0, 4), (2, 4))}


def test_partly_gold_node_descends_and_texts_are_node_texts():
    gi = gold_item(4, {0, 1})
    root, left = instances_for(gi)
    assert not root.fully_gold and left.fully_gold
    assert spans_pairs(root) == (((0, 4), (0, 2), (2, 4)),
                                 {((0, 2), (0, 4)), ((0, 4), (2, 4)), ((0, 2), (2, 4))})
    assert spans_pairs(left) == (((0, 2), (0, 1), (1, 2)), {((0, 2), (0, 1)), ((0, 2), (1, 2))})
    assert root.texts == tuple(node_text(gi.tree, s) for s in root.spans)
    assert root.texts[1] == "T: Sentence 0. Sentence 1."


def test_nested_gold_stops_below_fully_gold_nodes():
    # 6 leaves: (0,3)|(3,6); (0,3) -> (0,2)|(2,3); (0,2) -> (0,1)|(1,2). Gold {1, 3, 4, 5}.
    insts = instances_for(gold_item(6, {1, 3, 4, 5}))
    assert [i.spans[0] for i in insts] == [(0, 6), (0, 3), (0, 2), (3, 6)]
    by = {i.spans[0]: spans_pairs(i)[1] for i in insts}
    # root: both children overlap gold -> each beats the root, no non-gold child
    assert by[(0, 6)] == {((0, 3), (0, 6)), ((3, 6), (0, 6))}
    # (0,3): (0,2) holds gold leaf 1, (2,3) does not
    assert by[(0, 3)] == {((0, 2), (0, 3)), ((0, 3), (2, 3)), ((0, 2), (2, 3))}
    assert by[(0, 2)] == {((1, 2), (0, 2)), ((0, 2), (0, 1)), ((1, 2), (0, 1))}
    assert by[(3, 6)] == {((3, 6), (3, 5)), ((3, 6), (5, 6))}  # fully gold: keep the context


def test_whole_gold_and_single_leaf_items_give_no_instance(tiny_data_dir):
    import json

    qs = [json.loads(l) for l in (tiny_data_dir / "questions.jsonl").read_text().splitlines()]
    qs[0]["gold"] = [{"item_id": "t:a", "leaves": []}]  # whole-gold: no located span
    (tiny_data_dir / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    insts = build_instances({"tiny": tiny_data_dir}, split=None)
    assert "q0" not in {i.question_id for i in insts}
    assert {i.question_id for i in insts} == {f"q{k}" for k in range(1, 24)}
    assert instances_for(gold_item(1, {0})) == []
