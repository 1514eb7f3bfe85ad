import json
from pathlib import Path

import numpy as np
import pytest

from canopy_ray.core.lexical import scaled
from canopy_ray.eval.study import StudyPolicy, node_scores

ROOT = Path(__file__).resolve().parents[2]
REC = {"nodes": [[0, [0, 2]], [0, [0, 1]], [1, [0, 1]]], "tuned": [0.5, 0.4, 0.3], "bm25": [2.0, 0.0, 1.0],
       "cross": [0.9, 0.1, 0.2], "titled": [False, False], "leaf": [False, True, True], "titles": ["A", "B"],
       "bodies": ["", ""]}


def _p(text):
    return StudyPolicy.parse(text)


def test_link_reads_the_items_the_question_names_and_hop2_the_two_best_only():
    rec = {"nodes": [[i, [0, 1]] for i in range(4)], "tuned": [0.9, 0.8, 0.1, 0.0], "leaf": [True] * 4,
           "titles": ["Alpha One", "Beta Two", "Gamma Three", "Delta Four"], "bm25": [0.0] * 4,
           "bodies": ["Nothing here.", "Nor here.", "Gamma Three stands by Delta Four.", "A place."],
           "titled": [False, False, True, False]}  # the question names Gamma Three, which ranks third
    assert node_scores(rec, "tuned", _p("hybrid hop2=0.2"), 4)[3] == {(0, 1): pytest.approx(0.0)}
    assert node_scores(rec, "tuned", _p("hybrid link=0.2"), 4)[3] == {(0, 1): pytest.approx(0.2)}
    assert node_scores(rec, "tuned", _p("hybrid link=0.2"), 4)[2] == {(0, 1): pytest.approx(0.1)}  # never itself
    assert node_scores(rec, "tuned", _p("hybrid title=0.3"), 4)[2] == {(0, 1): pytest.approx(0.4)}


def test_a_policy_adds_each_term_by_its_weight():
    lex = scaled(REC["bm25"])
    got = node_scores(REC, "tuned", _p("hybrid bm25=0.8 cross=0.4"), 2)
    want = np.array(REC["tuned"]) + 0.8 * np.array(lex) + 0.4 * np.array(REC["cross"])
    assert [got[0][(0, 2)], got[0][(0, 1)], got[1][(0, 1)]] == pytest.approx(want.tolist())
    assert node_scores(REC, "cross", _p("hybrid"), 2)[1] == {(0, 1): pytest.approx(0.2)}
    assert node_scores(REC, "tuned", _p("canopy margin=0"), 2)[0] == {(0, 2): pytest.approx(0.5),
                                                                        (0, 1): pytest.approx(0.4)}


def test_rows_are_named_by_the_policy_text_a_config_takes():
    from canopy_ray.config import load_config
    from canopy_ray.eval.study import TERMS, rows_of

    names = {(b, str(sp)) for b, sp in rows_of(TERMS)}
    assert ("tuned", str(load_config().policy)) in names  # the shipped config's row exists
    assert _p("hybrid cutoff=0.8 share=0.40 bm25=0.4").text == "hybrid share=0.4 cutoff=0.8 bm25=0.4"
    lead = _p("lead share=0.4 fallback=0.02 bm25=0.4")
    assert not lead.product and lead.policy.kind == "hybrid" and lead.get("fallback") == 0.02
    assert _p("hybrid share=0.4 bm25=0.4").product


def test_the_shipped_config_is_the_studys_recorded_pick():
    """``--write-config`` wrote the pick into configs/cpu.yaml; a hand edit of either fails here."""
    from canopy_ray.config import load_config

    chosen = json.loads((ROOT / "results" / "study" / "study.json").read_text())["chosen"]
    if "=" not in chosen[1]:
        pytest.skip("results/study/study.json names its pick in the study's older names: rerun the study "
                    "(scripts/reproduce_eval.sh step 6) to record a pick in the policy text")
    assert ["tuned", str(load_config(ROOT / "configs" / "cpu.yaml").policy)] == chosen


def test_write_config_replaces_the_policy_line_and_refuses_study_only_picks(tmp_path):
    from canopy_ray.config import load_config
    from canopy_ray.eval.study import write_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text((ROOT / "configs" / "cpu.yaml").read_text())
    write_config(cfg, ("tuned", "hybrid share=0.5 cutoff=0.9 bm25=0.4"))
    assert str(load_config(cfg).policy) == "hybrid share=0.5 cutoff=0.9 bm25=0.4"
    for pick in (("tuned", "lead share=0.4"), ("f0", "hybrid share=0.4"), ("tuned", "hybrid bm25=0.4 prf=0.2")):
        with pytest.raises(ValueError, match="left as it is"):
            write_config(cfg, pick)
    assert str(load_config(cfg).policy) == "hybrid share=0.5 cutoff=0.9 bm25=0.4"


def test_adapter_names_the_f_theta_that_scores(tmp_path, monkeypatch):
    """``--adapter`` replaces the config's f_theta (another candidate's study)."""
    import canopy_ray.models.encoder as encoder
    from canopy_ray.eval.study import main

    seen = []

    def stop(models):
        seen.append(models.adapter)
        raise SystemExit(0)

    monkeypatch.setattr(encoder, "build_encoder", stop)
    for argv in ([], ["--adapter", str(tmp_path)]):
        with pytest.raises(SystemExit):
            main(["--work", str(tmp_path / "work"), "--tables", *argv])
    assert seen[0] != str(tmp_path) and seen[1] == str(tmp_path)


def test_feedback_reaches_the_second_hop_through_the_best_leaf():
    """A node that shares no word with the question gains from the words of the best item's best leaf."""
    from canopy_ray.core.evidence import node_text
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import TextItem
    from canopy_ray.core.lexical import bm25
    from canopy_ray.eval.study import feedback

    band = TextItem("a", "Velvet Harrow", ("Velvet Harrow formed in 2006.", "Its songs describe night fishing."))
    topic = TextItem("b", "Practices", ("Night fishing is common.", "Anglers surveyed lakes."))
    trees = [build_tree(band), build_tree(topic)]
    nodes = [[i, list(n.span)] for i, t in enumerate(trees) for n in t.nodes()]
    question = "Why are Velvet Harrow songs controversial?"
    rec = {"nodes": nodes, "tuned": [0.0] * len(nodes), "titled": [False, False],
           "bm25": bm25(question, [node_text(trees[i], tuple(s)) for i, s in nodes])}
    row = {(i, tuple(s)): k for k, (i, s) in enumerate(nodes)}
    fishing, anglers, formed = row[(1, (0, 1))], row[(1, (1, 2))], row[(0, (0, 1))]
    assert rec["bm25"][fishing] == rec["bm25"][anglers] == 0  # b shares no word with the question
    got = feedback(question, trees, rec, items=1)  # a's best leaf: its songs (the question's words)
    assert got[fishing] > 0 and got[anglers] == 0
    rec["tuned"][formed] = 5.0  # now a's best leaf is the other one: nothing reaches b
    assert feedback(question, trees, rec, items=1)[fishing] == 0


def test_gold_stats_counts_the_scorers_preferences_and_the_gold_leaves_the_policy_kept():
    """Decision accuracy follows the scores alone; gold recall follows what the policy kept, and an
    item left out keeps none of its gold leaves. Items that are not gold are not counted."""
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import Gold, Question, TextItem
    from canopy_ray.eval.study import gold_stats

    gold_item = TextItem("g", "G", ("The answer is here.", "Filler one.", "Filler two.", "Filler three."))
    other = TextItem("o", "O", ("Nothing.", "Nothing else."))
    trees = [build_tree(gold_item), build_tree(other)]
    q = Question("q", "Where?", ("here",), (Gold("g", (0,)),), ("g", "o"))
    # leaf 0 over its parent over the root, and the gold half over the other half: every preference holds
    right = [{(0, 4): 0.1, (0, 2): 0.5, (2, 4): 0.0, (0, 1): 0.9, (1, 2): 0.2, (2, 3): 0.0, (3, 4): 0.0},
             {(0, 2): 0.0, (0, 1): 0.0, (1, 2): 0.0}]
    wrong = [{**right[0], (0, 2): 0.05, (1, 2): 0.0}, right[1]]  # the gold half now scores below the root

    [kept_leaf] = gold_stats(q, trees, right, [[(0, 1)], []])
    assert (kept_leaf.pref_correct, kept_leaf.pref_nodes) == (2, 2)
    assert (kept_leaf.gold_kept, kept_leaf.gold_leaves) == (1, 1)
    [dropped] = gold_stats(q, trees, wrong, [[], [(0, 2)]])
    assert (dropped.pref_correct, dropped.pref_nodes) == (1, 2)
    assert dropped.gold_kept == 0


def test_a_length_term_favours_the_longer_node_by_its_sign():
    """``+len:beta``: beta x log(words); a parent outscores its equally scored child when beta > 0."""
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import TextItem
    from canopy_ray.eval.study import log_words

    tree = build_tree(TextItem("a", "T", ("One two three.", "Four five six seven.")))
    nodes = [[0, list(n.span)] for n in tree.nodes()]
    rec = {"nodes": nodes, "tuned": [0.5] * len(nodes), "bm25": [0.0] * len(nodes), "titled": [False]}
    rec["len"] = log_words([tree], rec)
    root, first = rec["nodes"].index([0, [0, 2]]), rec["nodes"].index([0, [0, 1]])
    assert rec["len"][root] > rec["len"][first] > 0
    up, down = (node_scores(rec, "tuned", _p(f"hybrid len={b}"), 1)[0] for b in (0.1, -0.1))
    assert up[(0, 2)] > up[(0, 1)] and down[(0, 2)] < down[(0, 1)]


def test_cut_keeps_the_leaves_within_d_of_the_best_and_raises_them_by_the_rule():
    """``hybrid share=1 cutoff=d``: every leaf within d of the question's best, whichever item holds
    it; with a share, only among that share; a chosen leaf rises to a parent that scores at least as high."""
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import TextItem
    from canopy_ray.eval.study import apply

    trees = [build_tree(TextItem("a", "A", ("One.", "Two.", "Three.", "Four."))),
             build_tree(TextItem("b", "B", ("Five.", "Six.")))]
    scores = [{(0, 4): 0.0, (0, 2): 0.95, (2, 4): 0.0, (0, 1): 0.9, (1, 2): 0.3, (2, 3): 0.1, (3, 4): 0.0},
              {(0, 2): 0.0, (0, 1): 0.75, (1, 2): 0.2}]
    assert apply(_p("hybrid share=1 cutoff=0.2"), trees, scores) == [[(0, 2)], [(0, 1)]]  # 0.9 rose to 0.95
    assert apply(_p("hybrid share=1 cutoff=0.1"), trees, scores) == [[(0, 2)], []]  # 0.75: 0.15 below, b out
    # leaves >= 0.1: a's third stays a leaf (its parent scores 0.0), b keeps both of its own
    assert apply(_p("hybrid share=1 cutoff=0.85"), trees, scores) == [[(0, 2), (2, 3)], [(0, 1), (1, 2)]]
    assert apply(_p("hybrid share=0.5 cutoff=0.85"), trees, scores) == [[(0, 2)], [(0, 1)]]  # best 3 of 6 only


def test_node_scores_are_cached_per_scorer_so_another_adapter_scores_afresh(tmp_path, monkeypatch):
    """The cached node scores in ``--work`` are named by the encoder's identity and the
    cross-encoder's weights: a study of another f_theta, base model or cross-encoder never replays
    the cached scores of an earlier one (and ``--tables`` checks which scorers both splits'
    results-*.json were replayed with)."""
    import types

    import canopy_ray.eval.runs as runs
    import canopy_ray.eval.study as study
    import canopy_ray.models.encoder as encoder

    paths, current = [], {}
    monkeypatch.setattr(encoder, "build_encoder", lambda models: types.SimpleNamespace(**current))
    monkeypatch.setattr(runs, "load_eval_set", lambda *a, **k: None)

    def record(eval_set, enc, path):
        paths.append(path)
        raise SystemExit(0)

    monkeypatch.setattr(study, "score_set", record)
    for ident in ({"model_id": "all-MiniLM-L6-v2", "adapter_id": "lora-a"},
                  {"model_id": "all-MiniLM-L6-v2", "adapter_id": "lora-b"},
                  {"model_id": "other-model", "adapter_id": "lora-a"},
                  {"model_id": "all-MiniLM-L6-v2", "adapter_id": "lora-a"}):
        current.update(ident)
        with pytest.raises(SystemExit):
            study.main(["--work", str(tmp_path), "--split", "validation"])
    assert len(set(paths[:3])) == 3 and paths[3] == paths[0]
    assert all(p.parent == tmp_path for p in paths)

    # the cross-encoder's scores: named by its weights (a copy elsewhere shares them), not its folder
    import shutil

    import torch

    from canopy_ray.models.cross import CrossScorer

    scorer = CrossScorer()
    one = scorer.save(tmp_path / "one")
    with torch.no_grad():
        scorer.head.bias += 1.0
    two = scorer.save(tmp_path / "two")
    copy = shutil.copytree(one, tmp_path / "copy")
    monkeypatch.setattr(study, "score_set", lambda *a: [])
    monkeypatch.setattr(study, "trees_of", lambda q, items: [])
    monkeypatch.setattr(runs, "load_eval_set", lambda *a, **k: types.SimpleNamespace(questions=[], items={}))

    def cross_path(questions, trees, recs, scorer, path):
        paths.append(path)
        raise SystemExit(0)

    monkeypatch.setattr(study, "cross_scores", cross_path)
    for path in (one, two, copy):
        with pytest.raises(SystemExit):
            study.main(["--work", str(tmp_path), "--split", "validation", "--cross", str(path)])
    assert paths[4] != paths[5] and paths[4] == paths[6] and paths[4] not in paths[:4]


def test_tables_refuse_a_split_replayed_with_other_scorers(tmp_path, monkeypatch, capsys):
    """``--tables`` joins the two splits' replays only when both used the scorers asked for now."""
    import json
    import types

    import canopy_ray.eval.study as study
    import canopy_ray.models.encoder as encoder

    monkeypatch.setattr(encoder, "build_encoder",
                        lambda models: types.SimpleNamespace(model_id="minilm", adapter_id="lora-a"))
    for split, adapter in (("validation", "minilm:lora-a"), ("test", "minilm:lora-b")):
        (tmp_path / f"results-{split}.json").write_text(
            json.dumps({"scorers": {"tuned": adapter, "cross": None}, "sets": {}}))
    assert study.main(["--work", str(tmp_path), "--tables"]) == 2
    assert "results-test.json was replayed with scorers {'tuned': 'minilm:lora-b'" in capsys.readouterr().err

    (tmp_path / "results-test.json").write_text((tmp_path / "results-validation.json").read_text())
    monkeypatch.setattr(study, "choose", lambda results: (_ for _ in ()).throw(SystemExit("joined")))
    with pytest.raises(SystemExit, match="joined"):
        study.main(["--work", str(tmp_path), "--tables"])


def test_the_bridge_term_in_the_study_picks_its_item_among_the_first_ask_as_the_compressor_does():
    # item 0's leaf ranks first: the bridge query reads item 0; item 1's leaf gains, item 0's does not
    read = []
    rec = {**REC, "single": [False, False, True], "bridge": lambda b: read.append(b) or np.array([0.9, 0.9, 0.6])}
    got = node_scores(rec, "tuned", _p("hybrid bridge=0.5"), 2)
    assert read == [0]
    assert got[0] == {(0, 2): pytest.approx(0.5), (0, 1): pytest.approx(0.4)}
    # item 1 is a single node: the hybrid's first ask holds it only with a link term, so it is not b;
    # flat asks every leaf first
    assert got[1] == {(0, 1): pytest.approx(0.3 + 0.5 * 0.3)}
    rec["tuned"] = [0.1, 0.1, 0.8]
    read.clear()
    node_scores(rec, "tuned", _p("hybrid bridge=0.5"), 2), node_scores(rec, "tuned", _p("flat bridge=0.5"), 2)
    assert read == [0, 1]
    with pytest.raises(ValueError, match="f_theta"):
        node_scores({**rec, "f0": rec["tuned"]}, "f0", _p("hybrid bridge=0.5"), 2)


def test_the_oracles_keep_the_gold_leaves_or_the_gold_items_whole():
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import Gold, Question, parse_item
    from canopy_ray.eval.study import oracle

    items = [parse_item({"id": i, "modality": "text", "title": i, "sentences": ["One.", " Two.", " Three."]})
             for i in ("a", "b", "c")]
    trees = [build_tree(it) for it in items]
    q = Question("q", "?", ("x",), (Gold("a", (1,)), Gold("c", ())), ("a", "b", "c"))
    assert oracle(_p("oracle-sentences"), q, trees) == [[(1, 2)], [], [(0, 3)]]
    assert oracle(_p("oracle-items"), q, trees) == [[(0, 3)], [], [(0, 3)]]
    assert not _p("oracle-items").product
