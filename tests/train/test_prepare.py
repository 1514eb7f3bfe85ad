"""The driver-side preparation: sampled instances, loop rows and their caches in the run dir."""

import numpy as np

from canopy_ray.config import load_config
from canopy_ray.train.instances import build_instances
from canopy_ray.train.prepare import prepare, train_instances


def tiny_cfg(model_dir, **training):
    return load_config(None, models={"encoder_path": str(model_dir), "max_length": 64},
                       training={"lora_layers": 1, "max_length": 64, **training})


def test_subsample_is_a_seeded_subset_in_the_original_order(tiny_bert_dir, tiny_data_dir):
    data = {"tiny": tiny_data_dir}
    every = build_instances(data, "train")
    some = train_instances(tiny_cfg(tiny_bert_dir, subsample=5), data)
    assert len(some) == 5 < len(every)
    assert [every.index(i) for i in some] == sorted(every.index(i) for i in some)
    assert train_instances(tiny_cfg(tiny_bert_dir, subsample=5), data) == some
    assert train_instances(tiny_cfg(tiny_bert_dir), data, limit=3) == every[:3]


def test_stop_repeat_repeats_only_the_fully_gold_instances(tiny_bert_dir, tiny_data_dir):
    data = {"tiny": tiny_data_dir}
    every = build_instances(data, "train")
    stops = [i for i in every if i.fully_gold]
    assert stops and len(stops) < len(every)
    tripled = train_instances(tiny_cfg(tiny_bert_dir, stop_repeat=3), data)
    assert len(tripled) == len(every) + 2 * len(stops)
    assert all(tripled.count(i) == (3 if i.fully_gold else 1) for i in every)


def test_rows_point_into_the_cached_queries_and_states(tiny_bert_dir, tiny_data_dir, tmp_path):
    cfg = tiny_cfg(tiny_bert_dir, val_instances=2)
    part = prepare(cfg, {"tiny": tiny_data_dir}, tmp_path / "run")
    states = np.load(part["bottom"][0], mmap_mode="r")
    offsets = np.load(part["bottom"][1])
    assert offsets[-1] == states.shape[0] and states.shape[1] == 32
    assert len(part["instances"]) == len(build_instances({"tiny": tiny_data_dir}, "train"))
    for qi, node_rows, pairs in part["instances"]:
        assert 0 <= qi < len(part["queries"]) and max(node_rows) < len(offsets) - 1
        assert all(0 <= a < len(node_rows) and 0 <= b < len(node_rows) for a, b in pairs)
    assert len(part["val"]["instances"]) == 2 and part["training"]["val_instances"] == 2
    cached = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert len(cached) == 6  # f0 queries + (states, offsets), train and validation; no temporaries
    again = prepare(cfg, {"tiny": tiny_data_dir}, tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == cached
    np.testing.assert_array_equal(again["queries"], part["queries"])
    assert again["bottom"] == part["bottom"] and again["instances"] == part["instances"]
