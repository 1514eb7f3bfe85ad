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
