import json
from dataclasses import replace
from pathlib import Path
from importlib import resources

import pytest

from canopy_ray.compressor import CompressOptions, Compressor, chosen, format_forest
from canopy_ray.core.policy import Policy
from canopy_ray.core.evidence import piece
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import parse_item

TEXT = parse_item({"id": "p", "modality": "text", "title": "Tinted Windows",
                   "sentences": ["Tinted Windows is an American rock supergroup.",
                                 "It formed in New York City in 2008.",
                                 "Their first performance was in Tulsa, Oklahoma.",
                                 "The drummer also played in Cheap Trick."]})
SAMPLE = resources.files("canopy_ray") / "assets" / "sample" / "corpus.jsonl"


def _scores(tree, values):
    return {n.span: v for n, v in zip(tree.nodes(), values)}  # pre-order


def refined(tree, scores, margin=0.0):
    """Algorithm 1's result over a fully scored tree."""
    return chosen(tree, scores, Policy("canopy", margin=margin).keep([tree.root], [scores])[0])


def test_refined_result_keeps_the_forest_and_renders_it():
    tree = build_tree(TEXT)  # (0,4) (0,2) (0,1) (1,2) (2,4) (2,3) (3,4)
    r = refined(tree, _scores(tree, [0.5, 0.2, 0.0, 0.0, 0.8, 0.9, 0.1]))
    assert r.kept == [(2, 3)]
    assert r.evidence.text == "Tinted Windows: Their first performance was in Tulsa, Oklahoma."
    assert r.tokens_after < r.tokens_before
    assert [n["decision"] for n in r.nodes()] == ["split", "dropped", "dropped", "dropped", "split", "kept", "dropped"]
    assert r.to_dict()["nodes_total"] == 7
    forest = format_forest(r)
    assert "[KEEP ] 2-3 +0.9000" in forest and "0-1" not in forest  # dropped subtrees stay folded


QUESTION = "Where did Tinted Windows first perform?"
A1 = "canopy margin=0"  # Algorithm 1, the paper's


def _full_scores(encoder, tree, query):
    """Every node scored, the way refinement was defined before lazy scoring."""
    vecs = encoder.encode_nodes([piece(tree, [n.span]) for n in tree.nodes()])
    q = encoder.encode_queries([query])[0]
    return {n.span: float(v @ q) for n, v in zip(tree.nodes(), vecs)}


@pytest.mark.integration
def test_lazy_scoring_equals_full_scoring_and_encodes_less(minilm):
    items = [parse_item(json.loads(line)) for line in SAMPLE.read_text().splitlines()[:12]]
    comp = Compressor(minilm, policy=A1)
    results = comp.compress(QUESTION, items)
    assert any(a <= 2 < b for a, b in comp.compress(QUESTION, [TEXT])[0].kept)
    for r in results:
        full = _full_scores(minilm, r.tree, QUESTION)
        assert r.kept == refined(r.tree, full).kept
        assert all(r.scores[s] == pytest.approx(full[s], abs=1e-5) for s in r.scores)
        assert r.encoded == len(r.scores) <= len(full)
        assert r.encoded_tokens == sum(minilm.token_counts(
            [piece(r.tree, [s]) for s in r.scores]))
    assert sum(r.encoded for r in results) < sum(len(r.tree.nodes()) for r in results)


@pytest.mark.integration
def test_stored_and_cached_vectors_skip_the_encoder(minilm):
    from canopy_ray.models.vector_cache import VectorCache

    tree = build_tree(TEXT)
    vecs = minilm.encode_nodes([piece(tree, [n.span]) for n in tree.nodes()])

    class Store:  # the node store's interface over vectors computed above
        def lookup(self, item_id):
            return {n.span: v for n, v in zip(tree.nodes(), vecs)} if item_id == TEXT.id else None

        def usable_for(self, encoder):
            return True

    class Refuses:
        model_id, adapter_id = minilm.model_id, minilm.adapter_id

        def encode_nodes(self, nodes):
            raise AssertionError("a stored or cached node must not be encoded")

    q = minilm.encode_queries([QUESTION])[0]
    comp = Compressor(Refuses(), node_store=Store(), policy=A1)
    (hit,) = comp.compress_items(q, [TEXT])
    (miss,) = Compressor(minilm, policy=A1).compress(QUESTION, [TEXT])
    assert hit.kept == miss.kept and hit.scores == pytest.approx(miss.scores)
    assert comp.stats["store"] == len(hit.scores) and comp.stats["encoded"] == hit.encoded == 0

    cache = VectorCache(1)
    first = Compressor(minilm, cache=cache, policy=A1)
    first.compress_items(q, [TEXT])
    again = Compressor(Refuses(), cache=cache, policy=A1)  # same identity: every node is a cache hit
    (cached,) = again.compress_items(q, [TEXT])
    assert cached.kept == miss.kept and again.stats["cache"] == len(cached.scores) and cached.encoded == 0
    other = Compressor(type("Other", (Refuses,), {"adapter_id": "lora-x"})(), cache=cache, policy=A1)
    with pytest.raises(AssertionError, match="must not be encoded"):
        other.compress_items(q, [TEXT])  # another adapter never reads these vectors


def test_flat_keeps_the_m_best_leaves():
    tree = build_tree(TEXT)
    leaves = {(0, 1): 0.0, (1, 2): 0.3, (2, 3): 0.9, (3, 4): 0.1}  # flat scores leaves only
    r = chosen(tree, leaves, Policy("flat", top=2).keep([tree.root], [leaves])[0])
    assert r.kept == [(1, 2), (2, 3)]
    assert r.evidence.text == ("Tinted Windows: It formed in New York City in 2008. "
                               "Their first performance was in Tulsa, Oklahoma.")


class HashEncoder:
    """Deterministic stand-in: a node's vector is a hash of its text; counts what it encodes."""

    model_id, adapter_id, dim = "hash", "frozen", 8

    def __init__(self):
        self.encoded = []

    def _vec(self, text):
        import numpy as np

        v = np.random.default_rng(abs(hash(text)) % 2**32).standard_normal(self.dim)
        return v / np.linalg.norm(v)

    def encode_queries(self, texts):
        import numpy as np

        return np.array([self._vec(t) for t in texts], np.float32)

    def encode_nodes(self, pieces):
        self.encoded.extend(p.spans for p in pieces)
        return self.encode_queries([p.text for p in pieces])

    def token_counts(self, pieces):
        return [len(p.text.split()) for p in pieces]


def test_each_policy_encodes_only_what_it_reads():
    enc = HashEncoder()
    q = enc.encode_queries(["q"])[0]
    comp = Compressor(enc, policy="canopy margin=0")
    (whole,) = comp.compress_items(q, [TEXT], CompressOptions(policy=Policy("whole")))
    # an item passed whole is a single-node tree: kept without a score, so nothing is encoded
    assert whole.kept == [(0, 4)] and enc.encoded == [] and whole.encoded == 0 and whole.scores == {}
    enc.encoded.clear()
    (fl,) = comp.compress_items(q, [TEXT], CompressOptions(policy=Policy("flat", top=1)))
    assert sorted(enc.encoded) == [((i, i + 1),) for i in range(4)] and len(fl.kept) == 1
    enc.encoded.clear()
    (hy,) = Compressor(enc, policy="hybrid share=0.25").compress_items(q, [TEXT])
    # the hybrid: every leaf, then only the parents its one chosen leaf may rise to, bottom up
    assert sorted(enc.encoded[:4]) == [((i, i + 1),) for i in range(4)] and hy.encoded == len(enc.encoded)
    best = max((hy.scores[(i, i + 1)], (i, i + 1)) for i in range(4))[1]
    chain = [(best[0] // 2 * 2, best[0] // 2 * 2 + 2), (0, 4)]  # its parent, then the root
    assert 4 < len(enc.encoded) and enc.encoded[4:] == [(s,) for s in chain[:len(enc.encoded) - 4]]
    enc.encoded.clear()
    (canopy,) = comp.compress_items(q, [TEXT])
    assert enc.encoded[0] == ((0, 4),) and len(enc.encoded) == canopy.encoded == len(canopy.scores)
    assert canopy.encoded_tokens == sum(len(piece(canopy.tree, [s]).text.split()) for s in canopy.scores)
    assert comp.stats["encoded"] == 4 + canopy.encoded


STUMPF = {"id": "stumpf", "modality": "text", "title": "John Stumpf", "sentences": [
    "John Gerard Stumpf (born September 15, 1953) is an American banker.",
    "He was named CEO of Wells Fargo in June 2007, succeeding Dick Kovacevich.",
    "He became chairman of the board in January 2010.",
    "Stumpf grew up on a dairy farm in Pierz, Minnesota, one of eleven children.",
    "He resigned in October 2016 after the Wells Fargo account fraud scandal."]}
EIFFEL = {"id": "eiffel", "modality": "text", "title": "Eiffel Tower", "sentences": [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "It is named after the engineer Gustave Eiffel, whose company designed and built the tower.",
    "It was constructed from 1887 to 1889 as the centerpiece of the 1889 World's Fair.",
    "The tower is 330 metres tall, about the same height as an 81-storey building."]}
STUMPF_Q = "When was Stumpf named CEO of Wells Fargo?"


@pytest.mark.integration
def test_shipped_defaults_keep_the_answer_and_do_not_keep_an_unrelated_paragraph_whole(minilm):
    import canopy_ray
    from canopy_ray.integrations import compress_texts

    stumpf, eiffel = canopy_ray.compress(STUMPF_Q, [STUMPF, EIFFEL])
    assert any(a <= 1 < b for a, b in stumpf.kept), stumpf.kept  # the answer sentence
    assert "June 2007" in stumpf.evidence.text
    assert eiffel.kept != [(0, 4)] and eiffel.tokens_after < eiffel.tokens_before
    # what the LangChain and LlamaIndex adapters return for each text
    texts = [(d["id"], d["title"], " ".join(d["sentences"])) for d in (STUMPF, EIFFEL)]
    (s_text, _), (e_text, e_report) = compress_texts(STUMPF_Q, texts)
    assert "June 2007" in s_text and len(e_text) < len(texts[1][2])


@pytest.mark.integration
def test_the_bridge_term_reads_the_question_again_beside_the_best_item(minilm):
    from canopy_ray.core.scoring import bridge_query

    items = [parse_item(json.loads(line)) for line in SAMPLE.read_text().splitlines()[:6]]
    queries = []

    class Counting:  # the packaged encoder, its queries recorded
        def __getattr__(self, name):
            return getattr(minilm, name)

        def encode_queries(self, texts):
            queries.extend(texts)
            return minilm.encode_queries(texts)

    plain = Compressor(minilm, policy="hybrid share=1").compress(QUESTION, items)
    results = Compressor(Counting(), policy="hybrid share=1 bridge=1").compress(QUESTION, items)
    # the best item by its best leaf (cosine alone here), read whole after the question
    best = max(range(len(plain)), key=lambda i: max(plain[i].scores.values(), default=-2.0))
    tree = results[best].tree
    assert queries == [QUESTION, bridge_query(QUESTION, piece(tree, [tree.root.span]).text)]
    lifted = 0
    for i, r in enumerate(results):
        first, second = _full_scores(minilm, r.tree, QUESTION), _full_scores(minilm, r.tree, queries[1])
        for span in r.scores:  # a node counts by the better of its two cosines
            cos = first[span]
            want = cos if i == best else max(cos, second[span])
            assert r.scores[span] == pytest.approx(want, abs=1e-5)
            lifted += i != best and second[span] > cos
    assert lifted  # some node scores higher against the second query


@pytest.mark.integration
def test_hybrid_mode_ranks_every_leaf_together_and_leaves_out_unchosen_items(minilm):
    from canopy_ray.core.evidence import node_text
    from canopy_ray.core.lexical import scaled_bm25
    from canopy_ray.core.refine import hybrid

    items = [parse_item(json.loads(line)) for line in SAMPLE.read_text().splitlines()[:8]]
    comp = Compressor(minilm, policy="hybrid share=0.3 bm25=0.4")
    results = comp.compress(QUESTION, items)
    trees = [r.tree for r in results]
    nodes = [(i, n.span) for i, t in enumerate(trees) for n in t.nodes()]
    lex = scaled_bm25(QUESTION, [node_text(trees[i], s) for i, s in nodes])
    full = [_full_scores(minilm, t, QUESTION) for t in trees]
    scores = [{} for _ in trees]
    for (i, s), x in zip(nodes, lex):
        scores[i][s] = full[i][s] + 0.4 * x
    assert [r.kept for r in results] == hybrid([t.root for t in trees], scores, 0.3)
    for r, sc in zip(results, scores):  # BM25 over every node, whichever of them were encoded
        assert r.scores == pytest.approx({s: sc[s] for s in r.scores}, abs=1e-5)
        assert r.encoded == len(r.scores)
    assert sum(r.encoded for r in results) < len(nodes)  # only the parents a chosen leaf may rise to
    out = [r for r in results if not r.kept]
    assert out, "a share of 0.3 leaves some of these items out"
    assert all(r.tokens_after == 0 and r.to_dict()["evidence"] == "" for r in out)
    assert {d for r in out for d in r.decisions.values()} == {"dropped"}


BRIDGE = json.loads((Path(__file__).parent / "fixtures" / "bridge.json").read_text())


@pytest.mark.integration
def test_the_link_term_raises_the_item_the_best_item_names():
    """The second hop of a bridge question: the Pittsburgh Penguins' arena sentence ranks low (the
    question names Chris Summers, not the Penguins), but the best item, Chris Summers's one
    sentence, names the Penguins; with ``link`` every node of their item scores that much more,
    and the answer stays at a share that loses it without."""
    from canopy_ray import load_config
    from canopy_ray.models.encoder import build_encoder

    enc = build_encoder(load_config().models)  # f_theta, as shipped
    items = [parse_item(d) for d in BRIDGE["items"]]
    plain, linked = (Compressor(enc, policy=f"hybrid share=0.4 bm25=0.4 link={w}").compress(BRIDGE["question"], items)
                     for w in (0, 0.2))
    titles = [r.tree.item.title for r in plain]
    for p, k, title in zip(plain, linked, titles):
        if not p.tree.root.children:  # the one-sentence item: scored only to rank the items by
            assert title == "Chris Summers (ice hockey)" and not p.scores and list(k.scores) == [(0, 1)]
            continue
        added = {round(k.scores[s] - p.scores[s], 5) for s in set(p.scores) & set(k.scores)}
        assert added == ({0.2} if title == "Pittsburgh Penguins" else {0.0}), (title, added)

    def evidence(results):
        return " ".join(r.to_dict()["evidence"] for r in results)
    assert "PPG Paints Arena" in evidence(linked) and "PPG Paints Arena" not in evidence(plain)


@pytest.mark.integration
def test_the_link_term_reads_the_item_the_query_names_though_it_ranks_low():
    """The item the question names by title is a bridge question's first hop, whatever it ranks:
    the link term reads it beside the two best items, so the club it names gains ``link``; the
    club's own text (it names Stockholm) is not read."""
    from canopy_ray import load_config
    from canopy_ray.models.encoder import build_encoder

    def item(id_, title, sentences):
        return parse_item({"id": id_, "modality": "text", "title": title, "sentences": sentences})

    question = "Which team did Arvid Lindqvist play for?"
    items = [item("al", "Arvid Lindqvist", ["He was born in Malmo in 1990.", " In 2012 he signed with Hammarby Rovers."]),
             item("hr", "Hammarby Rovers", ["Hammarby Rovers is a football club in Stockholm.", " Its ground is Sodra Park."]),
             item("t1", "Quiz night", ["Arvid Lindqvist played for a team that won the league.", " Nobody knew the answer."]),
             item("t2", "Football trivia", ["Fans often ask which team Arvid Lindqvist played for.",
                                            " The club's name is rarely remembered."]),
             item("t3", "Quiz answers", ["Arvid Lindqvist played for his team as a defender.", " Question two is harder."]),
             item("st", "Stockholm", ["Stockholm is the capital of Sweden.", " It lies on the Baltic Sea."])]
    enc = build_encoder(load_config().models)
    plain, linked = (Compressor(enc, policy=f"hybrid share=0.5 link={w}").compress(question, items) for w in (0, 0.2))
    best = {r.tree.item.id: max(v for s, v in r.scores.items() if s[1] - s[0] == 1) for r in plain}
    assert "al" not in sorted(best, key=best.get)[-2:], best  # not among the two best items
    for p, k in zip(plain, linked):
        added = {round(k.scores[s] - p.scores[s], 5) for s in set(p.scores) & set(k.scores)}
        # Hammarby Rovers: named by Arvid Lindqvist's item; his item: named by the best two
        assert added == ({0.2} if p.tree.item.id in ("hr", "al") else {0.0}), (p.tree.item.id, added)


def test_the_title_term_raises_every_node_of_the_items_the_query_names(minilm):
    """The title term: every scored node of an item whose title the query names (qualifier aside)
    scores exactly that much more, no other node moves; Algorithm 1 takes no terms."""
    from canopy_ray import load_config
    from canopy_ray.config import ConfigError

    def item(id_, title, sentences):
        return parse_item({"id": id_, "modality": "text", "title": title, "sentences": sentences})

    items = [item("hm", "Harbor Mills (bank)", ["Harbor Mills is a regional bank.", " It is based in Portsmouth.",
                                                " Its chief executive changed in 2011."]),
             item("gt", "Glass Tower", ["The Glass Tower is in Leeds.", " It was built in 1972.",
                                        " It is 90 metres tall."])]
    question = "When was Ana Petrov named CEO of Harbor Mills?"
    plain, titled = (Compressor.from_config(load_config(None, refinement={"policy": f"hybrid share=0.3 title={w}"}),
                                            minilm).compress(question, items) for w in (0, 0.3))
    for p, k in zip(plain, titled):
        shared = set(p.scores) & set(k.scores)
        assert shared
        want = 0.3 if p.tree.item.id == "hm" else 0.0
        assert {round(k.scores[s] - p.scores[s], 5) for s in shared} == {want}, p.tree.item.id
    with pytest.raises(ConfigError, match="cosine alone"):
        load_config(None, refinement={"policy": "canopy margin=0 title=0.3"})


def test_the_configs_cutoff_reaches_the_hybrid(minilm):
    """The policy's cutoff: of the chosen share, only leaves within it of the best leaf; at 0
    only the best leaf's item keeps anything (a tree without children is kept whatever it scores)."""
    from canopy_ray import load_config
    from canopy_ray.core.refine import hybrid

    items = [parse_item(json.loads(line)) for line in SAMPLE.read_text().splitlines()[:4]]
    policy = load_config().policy
    tight, loose = (Compressor.from_config(load_config(None, refinement={"policy": str(replace(policy, cutoff=c))}),
                                           minilm).compress(QUESTION, items) for c in (0.0, None))
    split = [bool(r.tree.root.children) for r in tight]
    assert sum(bool(r.kept) for r, s in zip(tight, split) if s) == 1
    assert sum(bool(r.kept) for r, s in zip(loose, split) if s) > 1
    assert [r.kept for r in tight] == hybrid([r.tree.root for r in tight], [r.scores for r in tight], policy.share,
                                             cutoff=0.0)


@pytest.fixture(scope="module")
def cross_scored(minilm):
    from canopy_ray.models.cross import CrossScored, CrossScorer

    return CrossScored(minilm, CrossScorer())


def test_the_cross_encoders_term_adds_to_each_cosine(cross_scored, minilm):
    """``cross`` adds the cross-encoder's (question, node) score to f_theta's cosine in the hybrid;
    without the query's text it refuses, and an encoder without a cross-encoder refuses it."""
    from canopy_ray.core.evidence import node_text
    from canopy_ray.core.refine import hybrid

    items = [parse_item(json.loads(line)) for line in SAMPLE.read_text().splitlines()[:4]]
    results = Compressor(cross_scored, policy="hybrid share=0.4 cross=0.4").compress(QUESTION, items)
    scores = []
    for r in results:
        spans = [n.span for n in r.tree.nodes()]
        pair = cross_scored.scorer.score(QUESTION, [node_text(r.tree, s) for s in spans])
        cos = _full_scores(minilm, r.tree, QUESTION)
        scores.append({s: cos[s] + 0.4 * float(p) for s, p in zip(spans, pair)})
        assert r.scores == pytest.approx({s: scores[-1][s] for s in r.scores}, abs=1e-5)
    assert [r.kept for r in results] == hybrid([r.tree.root for r in results], scores, 0.4)
    with pytest.raises(ValueError, match="query's text"):
        Compressor(cross_scored, policy="hybrid cross=0.4").compress_items(
            cross_scored.encode_queries([QUESTION])[0], items)
    with pytest.raises(ValueError, match="cross-encoder"):
        Compressor(minilm, policy="hybrid cross=0.4").compress(QUESTION, items)


@pytest.mark.filterwarnings("error::RuntimeWarning", "error::pytest.PytestUnraisableExceptionWarning")
def test_the_async_path_equals_the_sync_one_and_awaits_all_it_makes(cross_scored):
    """``acompress_items`` (Serve's Refiner: awaitable encode and score, gathered per level) keeps
    what ``compress_items`` keeps, and leaves no coroutine unawaited (Python warns of each)."""
    import asyncio
    import gc

    items = [parse_item(json.loads(line)) for line in SAMPLE.read_text().splitlines()[:4]]
    comp = Compressor(cross_scored, policy="hybrid share=0.4 cross=0.4")
    opts = CompressOptions(query=QUESTION)
    query_vec = cross_scored.encode_queries([QUESTION])[0]

    async def encode(pieces):
        return cross_scored.encode_nodes(pieces), cross_scored.token_counts(pieces)

    async def score(pieces):
        return cross_scored.score_nodes(QUESTION, pieces)

    async def query(text):
        return cross_scored.encode_queries([text])[0]

    for policy in ("hybrid share=0.4 cross=0.4", "hybrid share=0.4 cross=0.4 bm25=0.4 bridge=1"):
        comp = Compressor(cross_scored, policy=policy)
        served = asyncio.run(comp.acompress_items(query_vec, items, opts, encode, score, query))
        gc.collect()
        local = comp.compress_items(query_vec, items, opts)
        assert [r.kept for r in served] == [r.kept for r in local]
        for a, b in zip(served, local):
            assert a.scores == pytest.approx(b.scores, abs=1e-5)
    with pytest.raises(ValueError, match="query encoder"):
        asyncio.run(comp.acompress_items(query_vec, items, opts, encode, score))
