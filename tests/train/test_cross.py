import numpy as np
import pytest
import torch

from canopy_ray.core.evidence import node_text
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Gold, Question, TextItem
from canopy_ray.train.cross import Example, example_loss, examples_for, step_examples

STUMPF = TextItem("stumpf", "John Stumpf", (
    "John Stumpf is an American banker.", "He was named CEO of Wells Fargo in 2007.",
    "He became chairman in 2010.", "He resigned in 2016.", "He was born in Minnesota."))
EIFFEL = TextItem("eiffel", "Eiffel Tower", (
    "The Eiffel Tower is in Paris.", "It was built for the 1889 World's Fair.",
    "It is 330 metres tall.", "Millions visit it each year."))
QUESTION = Question("q1", "When was Stumpf named CEO of Wells Fargo?", ("2007",),
                    (Gold("stumpf", (1,)),), ("stumpf", "eiffel"))


def test_examples_label_gold_overlap_and_add_a_distractor_node():
    items = {"stumpf": STUMPF, "eiffel": EIFFEL}
    exs = examples_for("hotpotqa", items, [QUESTION], split=None)
    tree = build_tree(STUMPF)
    # root (0,5) -> (0,3)|(3,5); (0,3) -> (0,2)|(2,3); (0,2) -> (0,1)|(1,2); gold leaf 1
    root, mid, low, other = exs
    assert root.texts == tuple(node_text(tree, s) for s in ((0, 5), (0, 3), (3, 5)))
    assert root.overlap == (1 / 5, 1 / 3, 0.0) and low.overlap == (0.5, 0.0, 1.0)
    assert (1, 0) in root.pairs and (0, 2) in root.pairs and (1, 2) in root.pairs
    assert set(low.pairs) == {(2, 0), (0, 1), (2, 1)}
    assert other.texts[0].startswith("Eiffel Tower:") and other.overlap == (0.0,) * len(other.texts)
    assert other.pairs == ()
    assert examples_for("hotpotqa", items, [QUESTION], split="test") == []  # one split's questions only


def test_loss_falls_as_winners_rise_and_gold_scores_high():
    ex = Example("q", ("parent", "gold child", "other child"), (0.5, 1.0, 0.0), ((1, 0), (0, 2), (1, 2)))
    right = example_loss(torch.tensor([0.0, 4.0, -4.0]), ex)
    wrong = example_loss(torch.tensor([0.0, -4.0, 4.0]), ex)
    assert right < 0.7 < wrong
    # without pairs only the per-node term is left: an overlap-0 node is pushed down
    none = Example("q", ("a", "b"), (0.0, 0.0), ())
    assert example_loss(torch.tensor([-5.0, -5.0]), none) < example_loss(torch.tensor([5.0, 5.0]), none)


def test_batches_cover_each_epoch_once_and_cut_a_fraction():
    batches = step_examples(10, 1.5, 3, seed=0)
    assert len(batches) == 5  # 15 examples, 5 batches of 3
    first = np.concatenate(batches[:4])[:10]
    assert sorted(first) == list(range(10))  # epoch 1 is a permutation
    assert step_examples(10, 1.5, 3, seed=0)[4].tolist() == batches[4].tolist()


@pytest.mark.integration
def test_ray_train_ranks_the_answer_sentence_first_and_resumes(ray_local, tmp_path):
    """Steps on the Stumpf example (Ray Train) move the answer sentence above the rest; the scorer
    saved and loaded scores the same; the same run name continues from its last checkpoint."""
    from canopy_ray.config import load_config
    from canopy_ray.models.cross import CrossScorer
    from canopy_ray.train.cross import train_cross

    cfg = load_config(None, training={"cross": {"lr": 5e-4, "warmup": 0, "batch_size": 4}})
    exs = examples_for("hotpotqa", {"stumpf": STUMPF, "eiffel": EIFFEL}, [QUESTION], split=None) * 4
    first = train_cross(cfg, None, tmp_path, "run", examples=exs, max_steps=2, checkpoint_every=2)
    assert (first.steps, first.start_step) == (2, 0)
    done = train_cross(cfg, None, tmp_path, "run", examples=exs, max_steps=4, checkpoint_every=2)
    assert (done.steps, done.start_step) == (4, 2)
    leaves = [node_text(build_tree(STUMPF), (i, i + 1)) for i in range(5)]
    s = CrossScorer(done.adapter_dir).score(QUESTION.question, leaves)
    assert int(np.argmax(s)) == 1, s
    assert ((0 <= s) & (s <= 1)).all()
    np.testing.assert_allclose(CrossScorer(done.adapter_dir).score(QUESTION.question, leaves[::-1]), s[::-1],
                               atol=1e-5)
    assert not np.allclose(CrossScorer().score(QUESTION.question, leaves), s, atol=1e-3)
