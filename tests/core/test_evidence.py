from canopy_ray.core.evidence import (Piece, count_words, node_text, piece, render, render_evidence,
                                      truncate_newest_first)
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import parse_item

TEXT = parse_item({"id": "t", "modality": "text", "title": "Tulsa",
                   "sentences": ["Tulsa is a city.", " It is in Oklahoma.", " Bands play there."]})
TABLE = parse_item({"id": "tb", "modality": "table", "title": "Sales", "header": ["Type", "2019"],
                    "rows": [["Fixed", "1,452"], ["Other", "44"], ["Total", "1,496"]]})
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


def test_video_renders_time_ranges_frames_and_overlapping_transcript():
    tree = build_tree(VIDEO)  # 75 s -> [0, 30), [30, 75]
    assert node_text(tree, (1, 2)) == "Bunny\n[video b.mp4 30-75 s; frames at 30, 40, 50, 60, 70 s] bye"
    p = piece(tree, [(0, 1)])
    assert p.media == (("b.mp4", 0.0), ("b.mp4", 10.0), ("b.mp4", 20.0))


def test_image_renders_by_reference_and_caption():
    img = parse_item({"id": "i", "modality": "image", "title": "Cat", "path": "c.png", "caption": "a cat"})
    p = piece(build_tree(img), [(0, 1)])
    assert p.text == "Cat: a cat [image c.png]" and p.media == (("c.png", None),)


def test_count_words_counts_words_and_punctuation():
    assert count_words("Hello, world!") == 4


def _p(name, words, rnd):
    return Piece(name, "text", ((0, 1),), " ".join(["w"] * words), rnd)


def test_truncation_drops_the_oldest_first_and_keeps_order():
    pieces = [_p("a", 5, 1), _p("b", 5, 1), _p("c", 5, 2)]
    assert [p.item_id for p in truncate_newest_first(pieces, 10)] == ["b", "c"]
    assert [p.item_id for p in truncate_newest_first(pieces, 15)] == ["a", "b", "c"]
    assert truncate_newest_first(pieces, 4) == []


def test_truncation_uses_the_given_token_counter():
    pieces = [_p("a", 5, 1), _p("b", 5, 1)]
    assert [p.item_id for p in truncate_newest_first(pieces, 12, count=lambda s: 2 * len(s.split()))] == ["b"]


def test_render_evidence_joins_pieces():
    assert render_evidence([_p("a", 1, 1), _p("b", 2, 1)]) == "w\n\nw w"
