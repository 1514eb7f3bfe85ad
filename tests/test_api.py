"""``canopy_ray.compress``: the one-call in-process API agrees with the Compressor it wraps."""

import pytest

import canopy_ray
from canopy_ray.compressor import Compressor
from canopy_ray.core.items import parse_item

ITEM = {"id": "p1", "modality": "text", "title": "Saturn",
        "sentences": ["Saturn is the sixth planet.", "It has 95 moons.", "Its rings are mostly ice."]}


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, canopy_ray; sys.exit(any(m in sys.modules for m in ('torch', 'ray')))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.integration
def test_compress_takes_dicts_or_items_and_matches_the_compressor():
    query = "Which planet has 95 moons?"
    from_dicts = canopy_ray.compress(query, [ITEM], branching=3)
    from_items = canopy_ray.compress(query, [parse_item(ITEM)], branching=3)
    from canopy_ray.models.encoder import build_encoder

    # the default is the CPU config, tuned adapter and shipped policy included
    cfg = canopy_ray.load_config()
    comp = Compressor.from_config(cfg, build_encoder(cfg.models))
    expected = comp.compress(query, [parse_item(ITEM)], branching=3)
    assert [r.kept for r in from_dicts] == [r.kept for r in from_items] == [r.kept for r in expected]
    assert from_dicts[0].scores == pytest.approx(expected[0].scores, abs=1e-5)
    assert len(from_dicts[0].tree.root.children) == 3  # B = 3 over 3 sentences
    # a call's policy replaces the config's: Algorithm 1 scores by cosine alone, the shipped hybrid
    # adds its (non-negative) BM25, title and link terms to the same cosines
    paper = canopy_ray.compress(query, [ITEM], branching=3, policy="canopy margin=0")
    direct = comp.compress(query, [parse_item(ITEM)], branching=3, policy="canopy margin=0")
    assert [r.kept for r in paper] == [r.kept for r in direct]
    assert paper[0].scores == pytest.approx(direct[0].scores, abs=1e-5)
    shipped = from_dicts[0].scores
    assert all(shipped[s] >= v - 1e-6 for s, v in paper[0].scores.items() if s in shipped)
    assert any(shipped[s] > v + 0.1 for s, v in paper[0].scores.items() if s in shipped)
