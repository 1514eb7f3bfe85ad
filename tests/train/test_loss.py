import math

import torch

from canopy_ray.train.loss import batch_loss, instance_loss


def unit(*xs):
    v = torch.tensor(xs, dtype=torch.float64)
    return v / v.norm()


def test_instance_loss_equals_hand_computation():
    q = unit(1.0, 0.0)
    nodes = torch.stack([unit(1.0, 1.0), unit(1.0, 0.0), unit(0.0, 1.0)])  # s = .7071, 1, 0
    pairs = [(1, 0), (0, 2), (1, 2)]  # child 1 beats parent 0, parent beats child 2, 1 beats 2
    lam = 20.0
    s = [math.sqrt(0.5), 1.0, 0.0]
    expected = math.log(1 + sum(math.exp(lam * (s[b] - s[a])) for a, b in pairs))
    assert abs(float(instance_loss(q, nodes, pairs, lam)) - expected) < 1e-9


def test_loss_is_stable_for_large_violations_and_batch_is_the_mean():
    q = unit(1.0, 0.0)
    nodes = torch.stack([unit(0.0, 1.0), unit(1.0, 0.0)])
    bad = float(instance_loss(q, nodes, [(0, 1)], 1000.0))  # exp(1000) would overflow
    assert math.isfinite(bad) and abs(bad - 1000.0) < 1e-6
    good = float(instance_loss(q, nodes, [(1, 0)], 20.0))
    assert abs(good - math.log1p(math.exp(-20.0))) < 1e-12
    both = batch_loss(q[None], nodes, [(0, [0, 1], [(0, 1)]), (0, [0, 1], [(1, 0)])], 20.0)
    one = instance_loss(q, nodes, [(0, 1)], 20.0)
    assert abs(float(both) - (float(one) + good) / 2) < 1e-9


def test_a_pair_weight_multiplies_its_term_and_recall_pairs_are_the_gold_guarding_ones():
    import math

    import torch

    from canopy_ray.train.loss import instance_loss, recall_pairs

    q = torch.tensor([1.0, 0.0])
    nodes = torch.tensor([[0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])  # s = 0.6, 0.8, 0.0
    got = float(instance_loss(q, nodes, [(1, 0, 3.0), (0, 2)], 20.0))
    want = math.log(1 + 3 * math.exp(20 * (0.6 - 0.8)) + math.exp(20 * (0.0 - 0.6)))
    assert math.isclose(got, want, rel_tol=1e-5)
    assert float(instance_loss(q, nodes, [(1, 0, 1.0), (0, 2)], 20.0)) == float(
        instance_loss(q, nodes, [(1, 0), (0, 2)], 20.0))
    # partly gold v (index 0): child 1 gold, child 2 not -> only "1 over v" guards recall
    assert recall_pairs([(1, 0), (0, 2), (1, 2)], fully_gold=False) == [True, False, False]
    assert recall_pairs([(0, 1), (0, 2)], fully_gold=True) == [True, True]
