"""The study's pick (:func:`canopy_ray.eval.study.choose`) on hand-made validation rows.

A key qualifies when every set's delta (paired answer-recall difference against whole items)
is at least minus that set's tolerance; of those, the one saving the most tokens on average
over the sets wins; when none qualifies, the one with the best mean delta."""

from canopy_ray.eval.study import SETS, TOLERANCE, choose

A, B, C = ("tuned", "a"), ("tuned", "b"), ("f0", "c")
HAIR = 1e-9


def row(saved, delta) -> dict:
    """One key's cells on the three sets, in the order of SETS; ``kept`` rides along as the
    real rows' other fields do."""
    return {s: {"saved": sv, "delta": d, "kept": 0.5} for s, sv, d in zip(SETS, saved, delta)}


def val_of(rows: dict) -> dict:
    """``{set: {key: cells}}`` from ``{key: row(...)}``."""
    return {s: {key: r[s] for key, r in rows.items()} for s in SETS}


def test_the_sets_and_their_tolerances_are_the_protocols():
    # docs/evaluation.md: within 2 points (HotpotQA, NQ) or 1 point (TAT-QA) of whole items, and
    # 3 points on HotpotQA's chained questions (the slice, held when the rows have it)
    assert SETS == ("hotpotqa", "nq", "tatqa")
    assert TOLERANCE == {"hotpotqa": 0.02, "nq": 0.02, "tatqa": 0.01, "hotpotqa-bridge": 0.03}


def test_a_slice_in_the_rows_is_held_to_its_tolerance_but_adds_no_savings():
    ok = (0.0, 0.0, 0.0)
    val = val_of({A: row((0.60, 0.60, 0.60), ok), B: row((0.30, 0.30, 0.30), ok)})
    val["hotpotqa-bridge"] = {A: {"saved": 0.1, "delta": -0.031}, B: {"saved": 0.9, "delta": -0.03}}
    assert choose(val) == B  # A misses the slice's 3 points
    val["hotpotqa-bridge"][A]["delta"] = -0.03
    assert choose(val) == A  # inside: the sets' savings decide, not the slice's


def test_a_row_inside_every_tolerance_beats_one_saving_more_that_misses_one_by_a_hair():
    inside = tuple(-TOLERANCE[s] + HAIR for s in SETS)
    for missed in range(len(SETS)):  # the richer row misses each set's tolerance in turn
        outside = tuple(-TOLERANCE[s] - HAIR if i == missed else 0.0 for i, s in enumerate(SETS))
        val = val_of({A: row((0.30, 0.30, 0.30), inside), B: row((0.60, 0.60, 0.60), outside)})
        assert choose(val) == A, SETS[missed]
    # and once it is inside too, the richer row wins
    assert choose(val_of({A: row((0.30, 0.30, 0.30), inside), B: row((0.60, 0.60, 0.60), inside)})) == B


def test_a_delta_of_exactly_minus_the_tolerance_qualifies():
    edge = tuple(-TOLERANCE[s] for s in SETS)
    val = val_of({A: row((0.60, 0.60, 0.60), edge), B: row((0.10, 0.10, 0.10), (0.0, 0.0, 0.0))})
    assert choose(val) == A


def test_each_set_is_held_to_its_own_tolerance():
    # -0.015 is within HotpotQA's 0.02 but not within TAT-QA's 0.01
    safe = row((0.10, 0.10, 0.10), (0.0, 0.0, 0.0))
    on_hotpotqa = row((0.50, 0.50, 0.50), (-0.015, 0.0, 0.0))
    on_tatqa = row((0.50, 0.50, 0.50), (0.0, 0.0, -0.015))
    assert choose(val_of({A: on_hotpotqa, B: safe})) == A
    assert choose(val_of({A: on_tatqa, B: safe})) == B


def test_of_the_qualifying_rows_the_most_saved_on_average_wins():
    # A saves the most on one set (0.90) and B on the others; C has the best mean (0.40 > 0.3667, 0.3333)
    ok = (0.0, 0.0, 0.0)
    val = val_of({A: row((0.90, 0.10, 0.10), ok), B: row((0.20, 0.50, 0.30), ok),
                  C: row((0.40, 0.40, 0.40), ok)})
    assert choose(val) == C
    # the mean, not the worst set: B's worst (0.30) is below A's (0.35), its mean (0.50) above
    assert choose(val_of({A: row((0.35, 0.35, 0.35), ok), B: row((0.30, 0.60, 0.60), ok)})) == B
    # a row's delta above zero buys nothing: only its savings rank it
    val = val_of({A: row((0.40, 0.40, 0.40), (0.10, 0.10, 0.10)), B: row((0.41, 0.40, 0.40), ok)})
    assert choose(val) == B


def test_a_set_outside_SETS_neither_ranks_nor_disqualifies():
    ok = (0.0, 0.0, 0.0)
    val = val_of({A: row((0.50, 0.50, 0.50), ok), B: row((0.40, 0.40, 0.40), ok)})
    val["other"] = {A: {"saved": 0.0, "delta": -1.0}, B: {"saved": 1.0, "delta": 0.0}}
    assert choose(val) == A


def test_a_tie_in_mean_saved_goes_to_the_larger_key_whatever_the_order():
    ok = (0.0, 0.0, 0.0)
    rows = {A: row((0.50, 0.50, 0.50), ok), B: row((0.25, 0.75, 0.50), ok), C: row((0.10, 0.10, 0.10), ok)}
    assert choose(val_of(rows)) == B
    assert choose(val_of(dict(reversed(rows.items())))) == B
    # the larger of ("tuned", ...) and ("f0", ...) is "tuned": the scorer decides first
    rows = {A: row((0.50, 0.50, 0.50), ok), C: row((0.75, 0.25, 0.50), ok)}
    assert choose(val_of(rows)) == A and choose(val_of(dict(reversed(rows.items())))) == A


def test_when_nothing_qualifies_the_best_mean_delta_wins():
    # A: mean delta -0.05, its worst set -0.05, saves the most; B: mean -0.04, worst -0.12;
    # C: mean -0.0433, worst -0.03 (the best worst set)
    val = val_of({A: row((0.90, 0.90, 0.90), (-0.05, -0.05, -0.05)),
                  B: row((0.10, 0.10, 0.10), (0.0, 0.0, -0.12)),
                  C: row((0.20, 0.20, 0.20), (-0.05, -0.05, -0.03))})
    assert choose(val) == B
    # a tie in mean delta goes to the larger key too
    tie = {A: row((0.90, 0.90, 0.90), (-0.125, -0.125, -0.125)), B: row((0.10, 0.10, 0.10), (0.0, 0.0, -0.375))}
    assert choose(val_of(tie)) == choose(val_of(dict(reversed(tie.items())))) == B


def test_one_qualifying_row_beats_any_that_does_not():
    val = val_of({A: row((0.05, 0.05, 0.05), (-0.01, -0.01, -0.005)),
                  B: row((0.90, 0.90, 0.90), (0.05, 0.05, -0.0101))})
    assert choose(val) == A
