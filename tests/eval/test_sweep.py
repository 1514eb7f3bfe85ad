"""Sweeps on Ray: two points end to end on a tiny index (open setting), resume skips finished
points, a changed grid runs only the new point; the report writes the table and plots."""

import json
from pathlib import Path

import pytest
import yaml

import tests.eval.scripted as scripted
from canopy_ray.config import load_config
from canopy_ray.eval.sweep import (AblationSpec, DatasetSpec, GridSpec, PoolSpec, SweepSpec, expand, load_spec,
                                   point_key, run_sweep)
from tests.eval.conftest import CORPUS, QUESTIONS, ROOT

pytestmark = pytest.mark.integration


def _spec(index: Path, branching: list[int]) -> SweepSpec:
    return SweepSpec(config="configs/cpu.yaml", setting="open", questions=3, llm_cache=True,
                     datasets={"tiny": DatasetSpec(questions=str(QUESTIONS), index=str(index))},
                     ablation=None, grids=[GridSpec(methods=["shipped"], k=[2], branching=branching)],
                     pool=PoolSpec(min_actors=1, max_actors=2))


def _mtimes(out: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in (out / "points").rglob("*.json")}


def test_two_point_sweep_end_to_end_then_resume(tiny_index, tmp_path):
    out = tmp_path / "sweep"
    first = run_sweep(_spec(tiny_index, [2, 3]), out, root=ROOT, client_factory=scripted.scripted_factory,
                      progress=lambda s: None)
    assert sorted(first["ran"]) == ["tiny/shipped_k2_B2_n3", "tiny/shipped_k2_B3_n3"] and first["skipped"] == []
    for key in first["ran"]:
        run = json.loads((out / "points" / f"{key}.json").read_text())
        assert run["spec"]["setting"] == "open" and run["spec"]["k"] == 2 and run["errors"] == 0
        assert len(run["records"]) == 3 and all(len(r["retrieved"][0]) == 2 for r in run["records"])
        assert 0 <= run["aggregate"]["answer_recall"]["mean"] <= 1
    assert (out / "results.md").exists() and (out / "quality_vs_tokens.png").stat().st_size > 1000
    assert (out / "tokens_by_b.png").stat().st_size > 1000
    assert "| shipped | 2 | 3 |" in (out / "results.md").read_text()

    before = _mtimes(out)
    again = run_sweep(_spec(tiny_index, [2, 3]), out, root=ROOT, client_factory=scripted.scripted_factory,
                      progress=lambda s: None)
    assert again["ran"] == [] and len(again["skipped"]) == 2 and _mtimes(out) == before

    grown = run_sweep(_spec(tiny_index, [2, 3, 4]), out, root=ROOT, client_factory=scripted.scripted_factory,
                      progress=lambda s: None, report=False)
    assert grown["ran"] == ["tiny/shipped_k2_B4_n3"] and len(grown["skipped"]) == 2
    assert {k: v for k, v in _mtimes(out).items() if k in before} == before


def test_matched_points_replay_shipped_in_the_open_setting(tiny_index, tmp_path):
    spec = _spec(tiny_index, [2]).model_copy(update={"grids": [GridSpec(methods=["shipped", "random", "flat_matched"],
                                                                         k=[2], branching=[2])]})
    out = tmp_path / "sweep"
    done = run_sweep(spec, out, root=ROOT, client_factory=scripted.scripted_factory, progress=lambda s: None,
                     report=False)
    assert len(done["ran"]) == 3
    runs = {m: json.loads((out / "points" / "tiny" / f"{m}_k2_B2_n3.json").read_text())
            for m in ("shipped", "random", "flat_matched")}
    shipped = {r["id"]: r for r in runs["shipped"]["records"]}
    for m in ("random", "flat_matched"):
        assert runs[m]["errors"] == 0
        for r in runs[m]["records"]:
            c = shipped[r["id"]]
            assert r["retrieved"] == c["retrieved"] and set(r["kept_tokens"]) == set(c["kept_tokens"])
        # matched: within one leaf per item, so within a few percent over the run
        got = sum(sum(r["kept_tokens"].values()) for r in runs[m]["records"])
        budget = sum(sum(r["kept_tokens"].values()) for r in runs["shipped"]["records"])
        assert abs(got - budget) <= 0.15 * budget, (m, got, budget)


def test_a_point_searches_with_the_configs_nprobe(tiny_index, tmp_path):
    """The open setting's index is opened with retrieval.nprobe, as Serve opens it: auto is the
    nprobe the ivf index measured at indexing, a number is used as given."""
    import shutil

    from canopy_ray.eval.sweep import PointWorker
    from canopy_ray.index.manifest import IVF_RECALL, read_manifest
    from canopy_ray.indexer import run_index

    ivf = tmp_path / "ivf"
    shutil.copytree(tiny_index, ivf)  # the same parts, built again as ivf (no embedding)
    cfg = load_config(None, retrieval={"shards": 1, "index_type": "ivf", "nlist": 2},
                      index={"actors": 1, "shard_items": 10, "batch_items": 8})
    run_index(cfg, CORPUS, ivf, progress=False)
    measured = read_manifest(ivf)[IVF_RECALL]["nprobe"]
    point = {"dataset": "tiny", "setting": "open"}
    other = 3 - measured  # of the two lists, the count the index did not choose
    for nprobe, want in (("auto", measured), (other, other)):
        data = cfg.override(retrieval={"nprobe": nprobe}).model_dump()
        worker = PointWorker(data, {"tiny": {"index": str(ivf)}}, None, client_factory=scripted.scripted_factory)
        assert [s.nprobe for s in worker._index(point).shards.shards] == [want]


def test_committed_sweep_config_expands_to_the_ablation_and_the_grid():
    spec = load_spec(ROOT / "configs" / "sweep.yaml")
    points = expand(spec)
    keys = {point_key(p) for p in points}
    n = spec.questions
    for ds in spec.datasets:
        assert {f"{ds}/shipped_k{k}_B{b}_n{n}" for k in (5, 10, 20) for b in (2, 3, 4)} <= keys
        assert {f"{ds}/no_iteration_k{k}_B{b}_n40_noreader" for k in (5, 10, 20) for b in (2, 3, 4)} <= keys
        # vanilla passes items whole: B cannot matter, so it runs once per k
        assert {p["branching"] for p in points if p["dataset"] == ds and p["method"] == "vanilla"} == {2}
        assert "grid" in next(p for p in points if point_key(p) == f"{ds}/shipped_k10_B2_n{n}")["roles"]
        assert {p["method"] for p in points if p["dataset"] == ds and "ablation" in p["roles"]} == set(
            spec.ablation.methods)
    assert len(keys) == len(points)
    with pytest.raises(ValueError):
        SweepSpec.model_validate(yaml.safe_load("datasets: {x: {questions: q.jsonl}}\ngrids: [{methods: [nope]}]"))
    assert AblationSpec().methods[0] == "shipped"


def test_committed_k_by_b_grid_expands_to_every_point():
    spec = load_spec(ROOT / "configs" / "sweep-kb.yaml")
    keys = {point_key(p) for p in expand(spec)}
    for ds in spec.datasets:
        assert {f"{ds}/no_iteration_k{k}_B{b}_n60_noreader" for k in (5, 10, 20) for b in (2, 3, 4)} <= keys
