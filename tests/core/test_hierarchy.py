import pytest
from hypothesis import given, strategies as st

from canopy_ray import balanced_tree
from canopy_ray.core.hierarchy import build_tree, frame_times, split_sizes, video_segments
from canopy_ray.core.items import parse_item


def spans(node):
    return [n.span for n, _ in node.walk()]


@pytest.mark.parametrize("n,sizes", [(6, [3, 3]), (5, [3, 2]), (11, [6, 5]), (3, [2, 1]), (2, [1, 1])])
def test_binary_split_puts_the_larger_part_first(n, sizes):
    assert split_sizes(n, 2) == sizes


def test_eleven_leaves_split_as_in_the_spec():
    root = balanced_tree(11, 2)
    assert root.span == (0, 11)
    assert [c.span for c in root.children] == [(0, 6), (6, 11)]
    assert [[g.span for g in c.children] for c in root.children] == [[(0, 3), (3, 6)], [(6, 9), (9, 11)]]


def test_branching_larger_than_leaves_gives_one_child_per_leaf():
    root = balanced_tree(3, 4)
    assert [c.span for c in root.children] == [(0, 1), (1, 2), (2, 3)]
    assert balanced_tree(7, 3).children[0].span == (0, 3)  # 7 -> 3|2|2


def test_single_leaf_is_a_root_without_children():
    assert balanced_tree(1).children == ()


@pytest.mark.parametrize("bad", [0, -1])
def test_empty_tree_is_rejected(bad):
    with pytest.raises(ValueError):
        balanced_tree(bad)


@given(st.integers(1, 200), st.integers(2, 6))
def test_children_partition_their_parent_exactly(n, b):
    root = balanced_tree(n, b)
    leaves = []
    for node, _ in root.walk():
        if node.children:
            assert node.children[0].span[0] == node.span[0]
            assert node.children[-1].span[1] == node.span[1]
            for left, right in zip(node.children, node.children[1:]):
                assert left.span[1] == right.span[0]
            sizes = [c.size for c in node.children]
            assert sizes == sorted(sizes, reverse=True) and sizes[0] - sizes[-1] <= 1
            assert len(node.children) == min(b, node.size)
        else:
            leaves.append(node.span)
    assert leaves == [(i, i + 1) for i in range(n)]


def test_video_of_190_s_gives_six_segments_the_last_merging_the_tail():
    segs = video_segments(190, 30)
    assert len(segs) == 6
    assert segs[0] == (0, 30) and segs[-1] == (150, 190)


def test_short_video_is_one_segment():
    assert video_segments(12.5, 30) == [(0, 12.5)]


def test_frames_every_ten_seconds_inside_the_node():
    assert frame_times(0, 30) == [0, 10, 20]
    assert frame_times(150, 190) == [150, 160, 170, 180]
    assert frame_times(5, 21) == [10, 20]


def test_frames_are_evenly_thinned_to_the_maximum():
    times = frame_times(0, 1000, 10, 32)
    assert len(times) == 32 and times[0] == 0 and times[-1] == 990
    assert times == sorted(set(times))


def test_trees_per_modality():
    text = parse_item({"id": "t", "modality": "text", "sentences": ["a", "b", "c"]})
    table = parse_item({"id": "tb", "modality": "table", "header": ["h"], "rows": [["1"], ["2"]]})
    image = parse_item({"id": "i", "modality": "image", "path": "x.png"})
    video = parse_item({"id": "v", "modality": "video", "path": "v.mp4", "duration_s": 190})
    assert build_tree(text).root.span == (0, 3)
    assert build_tree(table).root.span == (0, 2)
    assert build_tree(image).root.children == ()
    tree = build_tree(video)
    assert tree.n_leaves == 6 and tree.time_range((3, 6)) == (90, 190)
    assert tree.frames((5, 6)) == [150, 160, 170, 180]


def test_aggregation_table_stays_whole():
    table = parse_item({"id": "tb", "modality": "table", "header": ["h"], "rows": [["1"], ["2"], ["3"]]})
    tree = build_tree(table, whole=True)
    assert tree.root.span == (0, 3) and tree.root.children == ()
