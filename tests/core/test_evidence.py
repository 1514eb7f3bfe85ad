from hypothesis import given, strategies as st

from canopy_ray.core.evidence import (CUT, PIECE_SEP, Piece, count_words, cut_to, evidence_body, head,
                                      node_text, piece, render, render_evidence, truncate_newest_first)
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import ImageItem, TableItem, TextItem, TranscriptSpan, VideoItem, parse_item

TEXT = parse_item({"id": "t", "modality": "text", "title": "Tulsa",
                   "sentences": ["Tulsa is a city.", " It is in Oklahoma.", " Bands play there."]})
TABLE = parse_item({"id": "tb", "modality": "table", "title": "Sales", "header": ["Type", "2019"],
                    "rows": [["Fixed", "1,452"], ["Other services", "44"], ["Total", "1,496"]]})
VIDEO = parse_item({"id": "v", "modality": "video", "title": "Bunny", "path": "b.mp4", "duration_s": 75,
                    "transcript": [{"start": 2, "end": 5, "text": "hello"}, {"start": 40, "end": 44, "text": "bye"}]})


def test_text_node_is_title_colon_stripped_sentences():
    tree = build_tree(TEXT)
    assert node_text(tree, (0, 2)) == "Tulsa: Tulsa is a city. It is in Oklahoma."
    assert render(tree, [(2, 3), (0, 1)]) == "Tulsa: Tulsa is a city. ... Bands play there."
    assert render(tree, [(1, 2), (0, 1)]) == node_text(tree, (0, 2))  # no gap, no marker


def test_every_table_node_repeats_the_header():
    tree = build_tree(TABLE)
    assert node_text(tree, (2, 3)) == "Sales\nType | 2019\nTotal | 1,496"
    assert render(tree, [(0, 1), (2, 3)]) == "Sales\nType | 2019\nFixed | 1,452\n...\nTotal | 1,496"


def test_a_gap_no_longer_than_its_marker_is_shown_instead():
    text = build_tree(parse_item({"id": "t", "modality": "text", "title": "Tulsa",
                                  "sentences": ["Tulsa is a city.", "Yes.", "Bands play there."]}))
    assert render(text, [(0, 1), (2, 3)]) == "Tulsa: Tulsa is a city. Yes. Bands play there."
    table = build_tree(parse_item({"id": "tb", "modality": "table", "title": "", "header": ["a", "b"],
                                   "rows": [["1", "2"], ["3", "4"], ["5", "6"]]}))
    assert render(table, [(0, 1), (2, 3)]) == "a | b\n1 | 2\n3 | 4\n5 | 6"  # "3 | 4" costs what "..." does


def test_video_renders_time_ranges_frames_and_overlapping_transcript():
    tree = build_tree(VIDEO)  # 75 s -> [0, 30), [30, 75]
    assert node_text(tree, (1, 2)) == "Bunny\n[video b.mp4 30-75 s; frames at 30, 40, 50, 60, 70 s] bye"
    p = piece(tree, [(0, 1)])
    assert p.media == (("b.mp4", 0.0), ("b.mp4", 10.0), ("b.mp4", 20.0))


def test_a_video_kept_in_both_halves_is_one_line_as_long_as_the_whole():
    # the quickstart's 69 s video: both segments kept rendered as two lines, 65 -> 95 tokens
    video = parse_item({"id": "v", "modality": "video", "title": "Big Buck Bunny", "path": "b.mp4",
                        "duration_s": 69, "transcript": [{"start": 20, "end": 40, "text": "a rabbit wakes up"}]})
    tree = build_tree(video)
    whole = piece(tree, [tree.root.span])
    both = piece(tree, [(0, 1), (1, 2)])
    assert both.text == whole.text == ("Big Buck Bunny\n[video b.mp4 0-69 s; frames at 0, 10, 20, 30, 40, 50, 60 s]"
                                       " a rabbit wakes up")
    assert both.media == whole.media and both.spans == ((0, 1), (1, 2))


def test_kept_segments_costing_more_than_the_whole_video_show_the_whole_video():
    # 210 s, 16 frames at most: three kept segments cost 50 words as two lines, the whole 45
    tree = build_tree(parse_item({"id": "v", "modality": "video", "title": "", "path": "b.mp4",
                                  "duration_s": 210}), max_frames=16)
    whole, ev = piece(tree, [tree.root.span]), piece(tree, [(0, 1), (4, 5), (6, 7)])
    assert (ev.text, ev.media) == (whole.text, whole.media) and count_words(ev.text) == 45


def test_image_renders_by_reference_and_caption():
    img = parse_item({"id": "i", "modality": "image", "title": "Cat", "path": "c.png", "caption": "a cat"})
    p = piece(build_tree(img), [(0, 1)])
    assert p.text == "Cat: a cat [image c.png]" and p.media == (("c.png", None),)
    far = parse_item({"id": "i", "modality": "image", "title": "Cat", "path": "/srv/media/c.png", "caption": "a cat"})
    p = piece(build_tree(far), [(0, 1)])  # the reader's text names the file; the media keeps the path
    assert p.text == "Cat: a cat [image c.png]" and p.media == (("/srv/media/c.png", None),)


def test_count_words_counts_words_and_punctuation():
    assert count_words("Hello, world!") == 4


# ---------------------------------------------------------------- never longer than the item

_STR = st.text(alphabet="ab1 .,:|-\n", max_size=12)


@st.composite
def item_trees(draw):
    kind = draw(st.sampled_from(["text", "table", "image", "video"]))
    title = draw(_STR)
    if kind == "text":
        item = TextItem("t", title, tuple(draw(st.lists(_STR, min_size=1, max_size=12))))
    elif kind == "table":
        width = draw(st.integers(1, 3))
        row = st.lists(_STR, min_size=width, max_size=width).map(tuple)
        item = TableItem("tb", title, draw(row), tuple(draw(st.lists(row, min_size=1, max_size=12))))
    elif kind == "image":
        item = ImageItem("i", title, "c.png", draw(_STR))
    else:
        duration = draw(st.floats(1, 700, allow_nan=False))
        spans = []
        for _ in range(draw(st.integers(0, 6))):
            start = draw(st.floats(0, duration, allow_nan=False))
            spans.append(TranscriptSpan(start, start + draw(st.floats(0.5, 200)), draw(_STR)))
        item = VideoItem("v", title, "b.mp4", duration, tuple(spans))
    return build_tree(item, branching=draw(st.integers(2, 4)), max_frames=draw(st.integers(1, 32)))


def _forest(node, data) -> list:
    """A random set of nodes none of which is another's ancestor (possibly empty)."""
    choice = data.draw(st.sampled_from(["keep", "drop", "split"] if node.children else ["keep", "drop"]))
    if choice == "keep":
        return [node.span]
    if choice == "drop":
        return []
    return [s for c in node.children for s in _forest(c, data)]


@given(item_trees(), st.data())
def test_evidence_is_never_longer_than_the_whole_item(tree, data):
    kept = _forest(tree.root, data)
    whole = piece(tree, [tree.root.span])
    ev = piece(tree, kept)
    assert ev.text == render(tree, kept) and ev.spans == tuple(sorted(kept))
    assert count_words(ev.text) <= count_words(whole.text) == count_words(render(tree, [tree.root.span]))
    assert len(ev.media) <= len(whole.media)  # no more frames than the whole video
    item = tree.item
    for a, b in kept:  # what was kept is shown
        if isinstance(item, TextItem):
            assert all(s.strip() in ev.text for s in item.sentences[a:b])
        elif isinstance(item, TableItem):
            assert all(" | ".join(r) in ev.text for r in item.rows[a:b])
        elif isinstance(item, VideoItem):
            t0, t1 = tree.time_range((a, b))
            assert all(s.text.strip() in ev.text for s in item.transcript if s.start < t1 and s.end > t0)


@given(item_trees())
def test_one_node_renders_as_itself(tree):
    for node in tree.nodes():
        assert piece(tree, [node.span]).text == node_text(tree, node.span)
        assert count_words(node_text(tree, node.span)) <= count_words(node_text(tree, tree.root.span))


# ---------------------------------------------------------------- the reader cap


def _p(name, words, rnd):
    return Piece(name, "text", ((0, 1),), " ".join(["w"] * words), rnd)


def test_truncation_drops_the_oldest_first_and_keeps_order():
    pieces = [_p("a", 5, 1), _p("b", 5, 1), _p("c", 5, 2)]
    assert [p.item_id for p in truncate_newest_first(pieces, 10)] == ["b", "c"]
    assert [p.item_id for p in truncate_newest_first(pieces, 15)] == ["a", "b", "c"]
    assert [p.item_id for p in truncate_newest_first(pieces, 13)] == ["b", "c"]  # 3 left: "w ..." needs 4


def test_the_newest_piece_that_does_not_fit_is_cut_to_the_tokens_left():
    pieces = [_p("a", 5, 1), _p("b", 5, 1), _p("c", 5, 2)]
    got = truncate_newest_first(pieces, 14)
    assert [(p.item_id, p.text) for p in got] == [("a", "w ..."), ("b", "w w w w w"), ("c", "w w w w w")]
    assert count_words(render_evidence(got)) == 14


def test_a_newest_piece_over_the_cap_is_cut_at_a_sentence_end_not_dropped():
    text = "Tulsa is a city. It is in Oklahoma. Bands play there."
    newest = Piece("t", "text", ((0, 3),), text, 2)
    cap = count_words(text) - 1  # the newest piece alone exceeds the cap
    got = truncate_newest_first([_p("old", 3, 1), newest], cap)
    assert [(p.item_id, p.text, p.round) for p in got] == [("t", "Tulsa is a city. It is in Oklahoma. ...", 2)]
    assert count_words(got[0].text) == cap
    assert cut_to(text, 10) == "Tulsa is a city. ..."  # the sentence end, not "Tulsa is a city. It ..."
    assert cut_to(text, 3) == ""  # not even one word and the marker fit


@given(st.lists(st.integers(1, 30), min_size=1, max_size=6), st.integers(4, 120))
def test_truncation_keeps_a_suffix_within_the_cap_and_never_returns_nothing(sizes, cap):
    pieces = [_p(f"p{i}", n, i) for i, n in enumerate(sizes)]
    got = truncate_newest_first(pieces, cap)
    assert got and count_words(render_evidence(got)) <= cap
    assert got[1:] == pieces[len(pieces) - len(got) + 1:]  # all but the oldest kept whole, newest first
    first = pieces[len(pieces) - len(got)]
    assert got[0] == first or (got[0].text.endswith(CUT) and first.text.startswith(got[0].text[:-len(CUT)]))
    if sum(sizes) > cap:
        assert count_words(render_evidence(got)) > cap - 4  # only the marker's worth of slack is lost


def test_truncation_uses_the_given_token_counter():
    pieces = [_p("a", 5, 1), _p("b", 5, 1)]
    assert [p.item_id for p in truncate_newest_first(pieces, 12, count=lambda s: 2 * len(s.split()))] == ["b"]


# ---------------------------------------------------------------- the body answer recall reads

BAND = TextItem("band", "Tinted Windows (band)", ("The group formed in New York City in 2008.",
                                                  " Its first performance was in Tulsa, Oklahoma."))


def test_a_text_piece_is_its_title_then_the_body():
    p = piece(build_tree(BAND), [(1, 2)])
    assert p.text == "Tinted Windows (band): Its first performance was in Tulsa, Oklahoma."
    assert p.head == head(BAND) == "Tinted Windows (band): "
    assert p.body == "Its first performance was in Tulsa, Oklahoma."  # the title is not the body's


def test_a_table_piece_is_its_title_and_header_row_then_the_kept_rows():
    tree = build_tree(TABLE)
    p = piece(tree, [(0, 1), (2, 3)])
    assert p.text == "Sales\nType | 2019\nFixed | 1,452\n...\nTotal | 1,496"
    assert p.head == head(TABLE) == "Sales\nType | 2019"  # every node of the table repeats the header
    assert p.body == "Fixed | 1,452\n...\nTotal | 1,496"
    untitled = TableItem("u", "", ("Type", "2019"), (("Fixed", "1,452"),))
    assert piece(build_tree(untitled), [(0, 1)]).body == "Fixed | 1,452"
    assert piece(build_tree(untitled), []).body == ""  # nothing kept: the header alone is no body


def test_evidence_body_joins_the_bodies_without_titles_or_header_rows():
    pieces = [piece(build_tree(BAND), [(0, 2)]), piece(build_tree(TABLE), [(1, 2)])]
    body = evidence_body(pieces)
    assert body == ("The group formed in New York City in 2008. Its first performance was in Tulsa, Oklahoma."
                    + PIECE_SEP + "Other services | 44")
    assert "Tinted Windows" not in body and "Sales" not in body and "2019" not in body and "Type" not in body
    assert render_evidence(pieces).startswith("Tinted Windows (band): The group")  # the reader still sees them


def test_a_piece_cut_inside_its_head_has_no_body():
    whole = piece(build_tree(TABLE), [(0, 3)])
    header_only = truncate_newest_first([whole], count_words("Sales\nType | 2019" + CUT))
    assert header_only[0].text == "Sales\nType | 2019" + CUT and header_only[0].body == CUT
    part = truncate_newest_first([whole], count_words("Sales\nType |" + CUT))
    assert part[0].text == "Sales\nType |" + CUT and part[0].body == ""  # cut inside the header row
    rows = truncate_newest_first([whole], count_words("Sales\nType | 2019\nFixed | 1,452\nOther services" + CUT))
    assert rows[0].body == "Fixed | 1,452" + CUT  # cut at the last line end, after the head


@given(item_trees(), st.data())
def test_every_piece_is_its_head_then_its_body(tree, data):
    kept = _forest(tree.root, data)
    ev = piece(tree, kept)
    assert ev.head == head(tree.item)
    # a table's kept rows start on the line after its header row
    sep = "\n" if isinstance(tree.item, TableItem) and kept else ""
    assert ev.text == ev.head + sep + ev.body


def test_render_evidence_joins_pieces():
    assert render_evidence([_p("a", 1, 1), _p("b", 2, 1)]) == "w\n\nw w"
