"""Length-sorted batches: bounds, and with an overhead per pass the cheapest cuts."""

import random

from canopy_ray.models.batching import length_batches


def cost(lengths, batches, overhead):
    return sum(overhead + len(b) * max(max(1, lengths[i]) for i in b) for b in batches)


def test_without_an_overhead_each_batch_takes_as_many_rows_as_fit():
    assert length_batches([10, 50, 20, 40], 3, None) == [[1, 3, 2], [0]]
    assert length_batches([10, 50, 20, 40], 8, 100) == [[1, 3], [2, 0]]  # 2 x 50, then 2 x 20
    assert length_batches([300, 5], 8, 100) == [[0], [1]]  # one row at least, however long


def test_an_overhead_keeps_short_texts_off_a_long_ones_width():
    # one batch: 64 + 8 x 100 = 864 padded-token units; [100, 60] and the rest: 64 + 200 + 64 + 180
    assert length_batches([100, 60, 30, 25, 20, 20, 18, 15], 64, 1024, overhead=64) == [[0, 1], [2, 3, 4, 5, 6, 7]]
    assert length_batches([30, 30, 30], 64, 1024, overhead=64) == [[0, 1, 2]]  # equal lengths stay together


def test_the_cuts_with_an_overhead_are_valid_and_never_cost_more():
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(1, 256) for _ in range(rng.randint(0, 40))]
        rows, tokens = rng.choice((4, 64)), rng.choice((None, 512, 1024))
        greedy = length_batches(lengths, rows, tokens)
        cheap = length_batches(lengths, rows, tokens, overhead=64)
        assert sorted(i for b in cheap for i in b) == list(range(len(lengths)))
        for b in cheap:
            assert len(b) <= rows and (len(b) == 1 or not tokens or len(b) * max(lengths[i] for i in b) <= tokens)
            assert all(lengths[i] >= lengths[j] for i, j in zip(b, b[1:]))  # longest first
        assert cost(lengths, cheap, 64) <= cost(lengths, greedy, 64)
