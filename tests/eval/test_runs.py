"""Run records and aggregation: intervals and paired differences on known samples, gold recall
on a hand-worked answer, the six methods on the tiny set with a scripted reader, the LLM cache."""

import asyncio
import json
import math
from types import SimpleNamespace

import pytest

from canopy_ray.core.policy import Policy

from canopy_ray.config import load_config
from canopy_ray.core.evidence import render
from canopy_ray.core.items import Gold, Question, TableItem, TextItem
from canopy_ray.core.metrics import bootstrap_ci
from canopy_ray.eval.cache import CachedChatClient
from canopy_ray.eval.methods import METHODS, parse_methods
from canopy_ray.core.splits import sample_questions
from canopy_ray.eval.runs import (METRICS, EvalSet, Runner, aggregate, gold_recalls, load_eval_set,
                                   paired_differences)
from canopy_ray.pipeline import Settings
from tests.eval.conftest import CORPUS, QUESTIONS
from tests.eval.scripted import ScriptedClient


def test_aggregate_is_the_bootstrap_over_defined_values():
    recs = [{"id": f"q{i}", "em": float(i % 2), "evidence_recall": None if i == 0 else i / 10, "tokens": 100 + i}
            for i in range(9)]
    agg = aggregate(recs, ["em", "evidence_recall", "tokens", "rounds"])
    assert agg["em"] == bootstrap_ci([float(i % 2) for i in range(9)]).as_dict() | {"n": 9}
    assert agg["evidence_recall"]["n"] == 8 and agg["evidence_recall"]["mean"] == pytest.approx(0.45)
    assert agg["tokens"]["low"] <= agg["tokens"]["mean"] == 104 <= agg["tokens"]["high"]
    assert agg["rounds"] == {"mean": None, "low": None, "high": None, "n": 0}  # strict JSON, no NaN
    json.dumps(agg, allow_nan=False)


def test_bootstrap_interval_on_a_known_sample():
    # 100 Bernoulli values, p = 0.5: the standard error is 0.05, the 95% interval about 0.5 +- 0.098
    agg = aggregate([{"id": str(i), "em": float(i < 50)} for i in range(100)], ["em"])["em"]
    assert agg["mean"] == 0.5 and 0.38 < agg["low"] < 0.42 and 0.58 < agg["high"] < 0.62
    const = aggregate([{"id": str(i), "f1": 0.25} for i in range(7)], ["f1"])["f1"]
    assert const["low"] == const["mean"] == const["high"] == 0.25


def test_paired_differences_pair_questions_by_id():
    a = [{"id": "x", "f1": 1.0}, {"id": "y", "f1": 0.5}, {"id": "z", "f1": None}, {"id": "w", "f1": 0.0},
         {"id": "only_a", "f1": 1.0}]
    b = [{"id": "y", "f1": 0.0}, {"id": "w", "f1": 0.0}, {"id": "x", "f1": 0.75}, {"id": "z", "f1": 1.0}]
    # by id, both defined: x 1 - 0.75, y 0.5 - 0, w 0 - 0 = [0.25, 0.5, 0] (z: a's is None; only_a: no pair)
    d = paired_differences(a, b, ["f1"])["f1"]
    assert d["n"] == 3 and d["mean"] == 0.25
    # a resample of 3 is all 0s (or all 0.5s) with probability 1/27 > 2.5%: the interval is [0, 0.5]
    assert (d["low"], d["high"]) == (0.0, 0.5)
    assert paired_differences(b, a, ["f1"])["f1"] == {"mean": -0.25, "low": -0.5, "high": 0.0, "n": 3}
    shift = paired_differences([{"id": str(i), "tokens": 10 + i} for i in range(5)],
                               [{"id": str(i), "tokens": 30 + i} for i in range(5)], ["tokens"])["tokens"]
    assert shift["mean"] == shift["low"] == shift["high"] == -20  # a constant difference has no spread


def test_gold_recalls_on_a_hand_worked_answer():
    q = Question("q", "?", ("x",), gold=(Gold("a", (1, 2)), Gold("b", (0,)), Gold("c", ())))
    ans = SimpleNamespace(results=[SimpleNamespace(id="a", kept=[(0, 2)]), SimpleNamespace(id="c", kept=[(3, 4)])])
    got = gold_recalls(q, ans)
    # leaves a1, a2, b0 (c is whole-gold, left out); only a1 kept; b was never retrieved
    assert got["evidence_recall"] == pytest.approx(1 / 3)  # end to end: b0 counts as missed
    assert got["refinement_recall"] == pytest.approx(1 / 2)  # shown to refinement: a1, a2 only
    assert (got["refinement_kept"], got["refinement_gold"]) == (1, 2)
    assert got["retrieval_recall"] == pytest.approx(2 / 3)  # a and c retrieved, b not
    missed = gold_recalls(q, SimpleNamespace(results=[SimpleNamespace(id="c", kept=[(0, 1)])]))
    assert math.isnan(missed["refinement_recall"]) and missed["evidence_recall"] == 0.0


def test_refinement_recall_aggregates_micro_the_others_per_question():
    # q0: 1 of 2 shown gold leaves kept, q1: 3 of 3 kept, q2: no gold shown (undefined)
    recs = [{"id": "q0", "refinement_recall": 0.5, "refinement_kept": 1, "refinement_gold": 2, "evidence_recall": 0.25},
            {"id": "q1", "refinement_recall": 1.0, "refinement_kept": 3, "refinement_gold": 3, "evidence_recall": 1.0},
            {"id": "q2", "refinement_recall": None, "refinement_kept": 0, "refinement_gold": 0, "evidence_recall": 0.0}]
    agg = aggregate(recs, ["refinement_recall", "evidence_recall"])
    assert agg["refinement_recall"]["mean"] == pytest.approx(4 / 5)  # micro: (1 + 3) / (2 + 3), not 0.75
    assert agg["refinement_recall"]["n"] == 2
    assert agg["refinement_recall"]["low"] <= 0.8 <= agg["refinement_recall"]["high"]
    assert agg["evidence_recall"]["mean"] == pytest.approx(1.25 / 3)  # per question, q2 included


def test_methods_map_to_pipeline_settings():
    base = Settings(k=10, rounds=3, branching=2)
    whole, shipped = Policy("whole"), base.policy
    assert METHODS["vanilla"].settings(base, k=5, rounds=4) == Settings(k=5, rounds=1, policy=whole)
    assert METHODS["no_projection"].settings(base) == Settings(policy=whole)
    assert METHODS["no_iteration"].settings(base, branching=3) == Settings(rounds=1, branching=3)
    assert METHODS["flat"].settings(base, flat_m=2) == Settings(policy=Policy("flat", top=2, terms=shipped.terms))
    assert METHODS["canopy"].settings(base, margin=0.05) == Settings(policy=Policy("canopy", margin=0.05))
    assert METHODS["shipped"].settings(base) == Settings(policy=shipped)
    assert METHODS["frozen"].frozen and not METHODS["shipped"].frozen
    assert METHODS["random"].settings(base, k=5) == Settings(k=5) and METHODS["random"].matched == "random"
    assert METHODS["flat_matched"].settings(base) == Settings() and METHODS["flat_matched"].matched == "flat"
    assert [m.name for m in parse_methods("all")] == list(METHODS)
    with pytest.raises(ValueError):
        parse_methods("canopy,bogus")


def test_sample_is_fixed_and_nested():
    qs = [Question(f"q{i}", "?") for i in range(30)]
    five, ten = sample_questions(qs, 5, seed=1), sample_questions(list(reversed(qs)), 10, seed=1)
    assert ten[:5] == five and sample_questions(qs, 5, seed=2) != five


# The shipped refinement, scored by cosine alone (no BM25 or named-item term beside it), so that node
# scores compare with the encoders' own cosines; tables classified by the LLM, so that its calls are counted
COSINE = load_config(None, refinement={"policy": "hybrid share=0.4 cutoff=0.8"}, critic={"table_classifier": "llm"})

@pytest.fixture(scope="module")
def runner(minilm):
    return Runner(COSINE, ScriptedClient(), encoder=minilm)


@pytest.fixture(scope="module")
def tiny_set():
    return load_eval_set("tiny", QUESTIONS, CORPUS)


@pytest.fixture(scope="module")
def tiny_runs(runner, tiny_set):
    return {name: runner.run(tiny_set, m) for name, m in METHODS.items()}


@pytest.mark.integration
def test_every_method_runs_with_all_metrics(tiny_runs):
    for name, run in tiny_runs.items():
        assert run["errors"] == 0 and len(run["records"]) == 3, name
        assert set(METRICS) <= set(run["aggregate"]) and run["spec"]["method"] == name
        json.dumps(run, allow_nan=False)


@pytest.mark.integration
def test_methods_behave_as_specified(tiny_runs, tiny_set, minilm, random_adapter, monkeypatch):
    by = {name: {r["id"]: r for r in run["records"]} for name, run in tiny_runs.items()}
    for r in by["vanilla"].values():  # one round, whole items, every candidate retrieved (k=10)
        assert r["rounds"] == 1 and r["llm_calls_by_role"] == {"reader": 1}
        # nothing compressed; the reader's tokens add the separators between the items
        assert r["tokens_before"] == r["tokens_after"] <= r["tokens"] <= r["tokens_after"] + 2 * len(r["kept"])
        assert r["evidence_recall"] == r["refinement_recall"] == r["retrieval_recall"] == 1.0
    for r in by["no_iteration"].values():
        assert r["rounds"] == 1 and "critic" not in r["llm_calls_by_role"]
    for qid, r in by["shipped"].items():
        assert r["tokens_after"] <= r["tokens_before"] == by["vanilla"][qid]["tokens_before"]
        # k = 10 over at most 5 candidates: all are in the evidence after round 1, so no critic
        assert r["rounds"] == 1 and "critic" not in r["llm_calls_by_role"]
    for r in by["no_projection"].values():
        assert r["tokens_after"] == r["tokens_before"]
    for r in by["flat"].values():  # m = 5 leaves per item at most
        assert all(sum(b - a for a, b in spans) <= 5 for spans in r["kept"].values())
    # no adapter in the default config: f_theta is f0, so frozen reproduces canopy exactly
    assert tiny_runs["frozen"]["spec"]["node_adapter"] == tiny_runs["shipped"]["spec"]["node_adapter"] == "frozen"
    for qid, r in by["shipped"].items():
        assert by["frozen"][qid]["kept"] == r["kept"] and by["frozen"][qid]["prediction"] == r["prediction"]

    # with an adapter (f_theta != f0): frozen scores nodes with f0, canopy with f_theta
    from canopy_ray.core.evidence import piece
    from canopy_ray.eval import runs
    from canopy_ray.models.encoder import TextEncoder

    tuned = Runner(COSINE, ScriptedClient(), encoder=TextEncoder(adapter=random_adapter))
    record = runs.question_record

    def run_scores(method):
        """The run, and per question the node scores of every item the pipeline compressed."""
        answers = {}

        def keep(q, ans, *args, **kw):
            answers[q.id] = ans
            return record(q, ans, *args, **kw)

        with monkeypatch.context() as m:
            m.setattr(runs, "question_record", keep)
            return tuned.run(tiny_set, METHODS[method]), answers

    def f0_scores(ans):
        """s(q, v) with f0 on both sides, for the query of the round that compressed the item."""
        out = {}
        for r in ans.results:
            q = minilm.encode_queries([ans.queries[r.evidence.round - 1]])[0]
            v = minilm.encode_items([piece(r.tree, [n.span]) for n in r.tree.nodes()])
            out[r.id] = {n.span: float(x) for n, x in zip(r.tree.nodes(), v @ q)}
        return out

    frozen_run, frozen_ans = run_scores("frozen")
    canopy_run, canopy_ans = run_scores("shipped")
    assert frozen_run["spec"]["node_adapter"] == "frozen"
    assert canopy_run["spec"]["node_adapter"] == tuned.encoder.adapter_id != "frozen"
    for qid in frozen_ans:  # on the nodes refinement scored (it scores only those it visits)
        ans = frozen_ans[qid]
        f0 = f0_scores(ans)
        for r in ans.results:
            assert r.scores and r.scores == pytest.approx({s: f0[r.id][s] for s in r.scores}, abs=1e-5), (qid, r.id)
        ans = canopy_ans[qid]
        f0 = f0_scores(ans)
        assert ans.results
        for r in ans.results:
            assert max(abs(x - f0[r.id][s]) for s, x in r.scores.items()) > 1e-3, (qid, r.id)
    # frozen with the adapter loaded reproduces canopy without one
    assert [r["kept"] for r in frozen_run["records"]] == [r["kept"] for r in tiny_runs["shipped"]["records"]]


@pytest.mark.integration
def test_matched_baselines_replay_canopy_at_its_tokens_per_item(tiny_runs, runner, tiny_set):
    canopy = {r["id"]: r for r in tiny_runs["shipped"]["records"]}
    differs = False
    for name in ("random", "flat_matched"):
        for r in tiny_runs[name]["records"]:
            c = canopy[r["id"]]
            # the same trajectory: queries, items per round, rounds; the critic is replayed, not asked
            assert (r["queries"], r["retrieved"], r["rounds"]) == (c["queries"], c["retrieved"], c["rounds"])
            assert "critic" not in r["llm_calls_by_role"] and r["llm_calls_by_role"]["reader"] == 1
            assert set(r["kept_tokens"]) == set(c["kept_tokens"])
            for item, budget in c["kept_tokens"].items():  # within one leaf of CANOPY's tokens
                tree = runner.compressor(False).tree(tiny_set.items[item])
                leaf = max(runner.count_tokens(render(tree, [n.span])) for n in tree.nodes() if n.is_leaf)
                assert abs(r["kept_tokens"][item] - budget) < leaf, (name, r["id"], item)
            differs |= r["kept"] != c["kept"]
    assert differs  # the baselines choose other leaves somewhere
    with pytest.raises(ValueError, match="reference"):
        asyncio.run(runner.arun(tiny_set, METHODS["random"], METHODS["random"].settings(runner.base_settings())))


@pytest.mark.integration
def test_skipping_the_reader_keeps_the_reader_independent_metrics(runner, tiny_set, tiny_runs):
    calls = runner.client.calls
    free = runner.run(tiny_set, METHODS["no_iteration"], reader=False)
    # only the table classifier (q1 and q3 have the sales table), no reader call
    assert runner.client.calls - calls == sum(r["llm_calls"] for r in free["records"]) == 2
    assert free["spec"]["reader"] is False and free["aggregate"]["em"]["n"] == 0
    for r, full in zip(free["records"], tiny_runs["no_iteration"]["records"]):
        assert r["em"] is None and "reader" not in r["llm_calls_by_role"]
        assert (r["tokens"], r["answer_recall"], r["evidence_recall"]) == (full["tokens"], full["answer_recall"],
                                                                           full["evidence_recall"])


# a text item with a title and a table with a header row; each question's answer sits in one place
HEADS_ITEMS = [TextItem("band", "Tinted Windows (band)", ("The group formed in New York City in 2008.",
                                                          "Its first performance was in Tulsa, Oklahoma.")),
               TableItem("sales", "Sales by type", ("Type", "2019", "2018"),
                         (("Fixed", "1,452", "1,146"), ("Other", "4", "56"), ("Staff", "14", "12")))]
HEADS_ANSWERS = {"title": ["Tinted Windows"], "header": ["2019"], "sentence": ["Tulsa"], "cell": ["4"],
                 "change": ["-1.4"], "spans": ["Fixed", "Lease"], "yes_no": ["yes"]}


@pytest.fixture(scope="module")
def heads_run(runner):
    """no_projection (every item shown whole) over the questions above, reader skipped."""
    qs = [Question(qid, f"Which {qid}?", tuple(a), candidates=("band", "sales")) for qid, a in HEADS_ANSWERS.items()]
    eval_set = EvalSet("heads", qs, {i.id: i for i in HEADS_ITEMS})
    return runner.run(eval_set, METHODS["no_projection"], reader=False)


@pytest.mark.integration
def test_body_answer_recall_leaves_out_titles_and_header_rows(heads_run):
    rec = {r["id"]: r for r in heads_run["records"]}
    assert heads_run["errors"] == 0 and all(sorted(r["kept"]) == ["band", "sales"] for r in rec.values())
    # (body, informative, short, whole evidence): in a title or header row the reader sees the
    # answer, but it is not in the body and the question is not informative; "-1.4" is short and
    # no token of the evidence is 1.4 ("14" is not); any one span of several counts
    want = {"title": (0.0, False, False, 1.0), "header": (0.0, False, False, 1.0),
            "sentence": (1.0, True, False, 1.0), "cell": (1.0, True, True, 1.0),
            "change": (0.0, True, True, 0.0), "spans": (1.0, True, False, 1.0), "yes_no": (0.0, False, False, 0.0)}
    got = {q: (r["answer_recall"], r["informative"], r["short"], r["answer_recall_titled"]) for q, r in rec.items()}
    assert got == want
    for q, (body, useful, short, _) in want.items():
        assert rec[q]["answer_recall_informative"] == (body if useful else None), q
        assert rec[q]["answer_recall_short"] == (body if useful and short else None), q


@pytest.mark.integration
def test_informative_and_short_answer_recall_aggregate_with_their_own_n(heads_run):
    agg = heads_run["aggregate"]
    assert (agg["answer_recall"]["n"], agg["answer_recall"]["mean"]) == (7, pytest.approx(3 / 7))
    assert (agg["answer_recall_informative"]["n"], agg["answer_recall_informative"]["mean"]) == (4, 0.75)
    assert (agg["answer_recall_short"]["n"], agg["answer_recall_short"]["mean"]) == (2, 0.5)
    assert agg["answer_recall_titled"]["mean"] == pytest.approx(5 / 7)


def test_chat_cache_answers_repeats_and_survives_reopening(tmp_path):
    inner = ScriptedClient()
    msgs = [{"role": "user", "content": "Evidence:\nTulsa\n\nQuestion: where?"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "canopy_reader", "schema": {}}}
    cached = CachedChatClient(inner, tmp_path / "c.sqlite")
    first = cached.chat(msgs, response_format=fmt, max_tokens=8)
    again = asyncio.run(cached.achat(msgs, response_format=fmt, max_tokens=8))
    assert inner.calls == 1 and cached.hits == 1 and again.content == first.content == '{"answer": "Tulsa"}'
    assert cached.saved_s["reader"] == first.latency_s > 0
    cached.chat(msgs, response_format=fmt, max_tokens=9)  # another request: a miss
    assert inner.calls == 2
    cached.close()
    reopened = CachedChatClient(ScriptedClient(), tmp_path / "c.sqlite")
    assert reopened.chat(msgs, response_format=fmt, max_tokens=8).content == first.content and reopened.hits == 1
