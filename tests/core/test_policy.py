"""The refinement policy: one text form, and what each policy asks for and keeps."""

import pytest

from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import parse_item
from canopy_ray.core.policy import Policy, PolicyError
from canopy_ray.core.refine import drive, hybrid, refine
from canopy_ray.core.scoring import Terms

ITEM = parse_item({"id": "a", "modality": "text", "title": "A",
                   "sentences": ["One.", " Two.", " Three.", " Four."]})
LONE = parse_item({"id": "b", "modality": "text", "title": "B", "sentences": ["Alone."]})
TREE, SINGLE = build_tree(ITEM), build_tree(LONE)  # (0,4) (0,2) (0,1) (1,2) (2,4) (2,3) (3,4); (0,1)
SCORES = dict(zip([n.span for n in TREE.nodes()], [0.5, 0.2, 0.0, 0.0, 0.8, 0.9, 0.1]))


@pytest.mark.parametrize("text", ["canopy margin=0", "canopy margin=0.05", "canopy margin=auto",
                                  "hybrid share=0.4 cutoff=0.8 bm25=0.4 title=0.1 link=0.2",
                                  "hybrid share=0.5 cross=0.2", "hybrid share=1 z=0.5 bm25=0.4 bridge=1",
                                  "flat share=0.4", "flat top=5 bm25=0.4", "whole"])
def test_the_text_form_is_one_and_round_trips(text):
    assert str(Policy.parse(text)) == text and Policy.parse(str(Policy.parse(text))) == Policy.parse(text)


def test_parsing_normalises_and_fills_defaults():
    p = Policy.parse("hybrid  bm25=0.40 cutoff=0.8 share=0.4")
    assert p == Policy("hybrid", share=0.4, cutoff=0.8, terms=Terms(bm25=0.4))
    assert str(p) == "hybrid share=0.4 cutoff=0.8 bm25=0.4"
    assert Policy.parse("canopy margin=auto").margin is None
    assert Policy.parse("canopy margin=auto").with_margin(0.08) == Policy("canopy", margin=0.08)
    assert Policy.parse("hybrid").with_margin(0.08) == Policy.parse("hybrid")


@pytest.mark.parametrize("text, reason", [
    ("mode=hybrid", "start with one of"), ("canopy bm25=0.4", "cosine alone"), ("whole title=0.1", "cosine alone"),
    ("hybrid margin=0.1", "hybrid takes"), ("flat margin=0", "flat takes"), ("hybrid share=0", r"share must be in"),
    ("hybrid share=1.5", "share must be in"), ("flat top=0", "top must be"), ("hybrid cutoff=-1", "cutoff must be"),
    ("canopy margin=-0.1", "margin must be"), ("canopy z=1", "canopy takes"), ("canopy bridge=1", "cosine alone"), ("hybrid bm25=-1", "bm25 must be"), ("hybrid share", "hybrid takes"),
    ("hybrid share=x", "must be a number"), ("hybrid share=0.4 share=0.5", "twice"), ("hybrid share=nan", "finite")])
def test_bad_policies_are_refused_with_the_reason(text, reason):
    with pytest.raises(PolicyError, match=reason):
        Policy.parse(text)


def test_a_value_built_in_code_is_checked_too():
    with pytest.raises(PolicyError, match="cosine alone"):
        Policy("canopy", terms=Terms(link=0.2))
    with pytest.raises(PolicyError, match="takes no cutoff"):
        Policy("canopy", cutoff=0.5)


def _run(policy, trees, scores):
    """What the policy asks for (every asked node's score from ``scores``) and what it keeps."""
    asked = []

    def score(ask):
        asked.extend((i, n.span) for i, n in ask)
        return [scores[i][n.span] for i, n in ask]

    got = drive(policy.asks([t.root for t in trees]), score)
    return asked, policy.keep([t.root for t in trees], got)


def test_canopy_asks_for_the_visited_nodes_and_keeps_algorithm_1():
    asked, kept = _run(Policy("canopy", margin=0.0), [TREE, SINGLE], [SCORES, {(0, 1): 0.3}])
    assert kept == [refine(TREE.root, SCORES), [(0, 1)]] == [[(2, 3)], [(0, 1)]]
    # the root, its children, then the children of the one that beat it; the lone leaf is never scored
    assert asked == [(0, (0, 4)), (0, (0, 2)), (0, (2, 4)), (0, (2, 3)), (0, (3, 4))]
    _, wide = _run(Policy("canopy", margin=0.5), [TREE], [SCORES])
    assert wide == [[(0, 4)]]  # no child beats the root by 0.5: it is kept whole


def test_hybrid_ranks_all_leaves_together_and_leaves_out_unchosen_items():
    other = build_tree(parse_item({"id": "c", "modality": "text", "title": "C", "sentences": ["X.", " Y."]}))
    low = {(0, 2): 0.0, (0, 1): 0.05, (1, 2): 0.02}
    asked, kept = _run(Policy("hybrid", share=0.15), [TREE, other], [SCORES, low])  # 1 of the 6 leaves
    assert kept == hybrid([TREE.root, other.root], [SCORES, low], 0.15) == [[(2, 3)], []]
    assert asked[:6] == [(0, (0, 1)), (0, (1, 2)), (0, (2, 3)), (0, (3, 4)), (1, (0, 1)), (1, (1, 2))]
    assert asked[6:] == [(0, (2, 4))]  # the chosen leaf's parent, which does not beat it; nothing of C
    _, cut = _run(Policy("hybrid", share=1.0, cutoff=0.5), [TREE, other], [SCORES, low])
    assert cut[1] == []  # every leaf chosen by share, but X and Y score more than 0.5 below the best
    _, by_z = _run(Policy("hybrid", share=1.0, z=0.0), [TREE, other], [SCORES, low])
    assert by_z == [[(2, 3)], []]  # the leaves' mean is .18: only .9 stands above it


def test_flat_keeps_leaves_unraised_by_share_or_per_item():
    _, by_share = _run(Policy("flat", share=0.5), [TREE, SINGLE], [SCORES, {(0, 1): 0.0}])
    assert by_share == [[(2, 3), (3, 4)], [(0, 1)]]
    _, top = _run(Policy("flat", top=1), [TREE, SINGLE], [SCORES, {(0, 1): 0.0}])
    assert top == [[(2, 3)], [(0, 1)]]
    _, by_z = _run(Policy("flat", share=1.0, z=0.0), [TREE, SINGLE], [SCORES, {(0, 1): 0.0}])
    assert by_z == [[(2, 3)], [(0, 1)]]  # mean .25 of the four leaves


def test_whole_asks_for_nothing_and_keeps_every_root():
    asked, kept = _run(Policy("whole"), [TREE, SINGLE], [SCORES, {}])
    assert asked == [] and kept == [[(0, 4)], [(0, 1)]]
