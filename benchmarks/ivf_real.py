"""ivf recall on real MiniLM vectors, and how close the synthetic mixture of ``benchmarks/scale.py`` is.

    python benchmarks/ivf_real.py --items 200        # embeds (cached in --work-dir), measures, renders scale.md

For each shared corpus (HotpotQA, NQ, TAT-QA, converted by ``canopy_ray.data.sets.prepare_shared``),
a seeded sample of ``--items`` items is embedded as the index job embeds them
(``canopy_ray.index.ingest.NodeEmbedder`` with ``--config``: f0 item vectors, f_theta node vectors);
the three samples together stand for the open-setting index (one index of the three corpora).
Each vector set, and the synthetic mixture of ``scale.py`` at the same size and dimension, gets:

- ivf (``ShardedIndex.build``: nlist by the project's auto rule, ``retrieval.shards`` shards):
  recall@10 against exact fp32 search at several ``nprobe``, for the set's own vectors as queries
  (each query's nearest other rows, as an ivf index measures itself at indexing) and, for item
  vectors, the corpus's questions encoded by f0 (what a search is asked; for the mixture, points
  of a stream no item uses); and the ``nprobe`` the index chose for ``retrieval.recall_target``;
- shape: the share of variance in the top 10 and top 48 principal components; nearest-neighbour
  contrast (median over the sampled queries of the distance to the nearest other row, and to the
  10th, over the mean distance to all rows: lower = neighbours stand out more); the mean cosine
  between a vector and the set's mean direction (anisotropy); the share of queries with an exact
  duplicate among the other rows.

Writes ``results/bench/ivf_real.json``; ``scale.md`` shows it (rendered again here).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SETS = ("hotpotqa", "nq", "tatqa")
NPROBES = (1, 2, 4, 8, 16)
QUESTIONS, SEED, K = 300, 0, 10


def sample_lines(corpus: Path, n: int) -> list[str]:
    lines = [line for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    pick = np.sort(np.random.default_rng(SEED).choice(len(lines), min(n, len(lines)), replace=False))
    return [lines[i] for i in pick]


def embed_set(cfg, data_dir: Path, n_items: int, emb) -> dict:
    """Item (f0) and node (f_theta) vectors of a seeded sample of the corpus, questions by f0."""
    from canopy_ray.index.ingest import validate_row

    items = []
    for raw in sample_lines(data_dir / "corpus.jsonl", n_items):
        _, _, reason, _, item = validate_row(raw, data_dir)
        if not reason:
            items.append(item)
    t0 = time.perf_counter()
    node_vecs, item_vecs = [], []
    for a in range(0, len(items), cfg.index.batch_items):
        _, nv, iv = emb.embed(items[a:a + cfg.index.batch_items])
        node_vecs += nv
        item_vecs.append(iv)
    qs = [json.loads(line)["question"] for line in sample_lines(data_dir / "questions.jsonl", QUESTIONS)]
    return {"items": np.concatenate(item_vecs), "nodes": np.concatenate(node_vecs).astype(np.float32),
            "questions": emb.encoder.encode_queries(qs).astype(np.float32),
            "embed_s": round(time.perf_counter() - t0, 1)}


def vectors_of(cfg, args) -> dict[str, dict]:
    """Per set its vectors, embedded once and kept in ``--work-dir`` (a rerun only measures)."""
    from canopy_ray.data.sets import prepare_shared

    out, emb = {}, None
    dirs = prepare_shared(args.shared_data, args.data_dir, list(SETS))
    for name in SETS:
        cache = args.work_dir / f"{name}-{args.items}.npz"
        if not cache.is_file():
            if emb is None:
                from canopy_ray.index.ingest import NodeEmbedder

                emb = NodeEmbedder(cfg.models, cfg.hierarchy, threads=args.threads)
            got = embed_set(cfg, Path(dirs[name]), args.items, emb)
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cache, **got)
        z = np.load(cache)
        out[name] = {k: z[k] for k in z.files}
        print(f"[ivf_real] {name}: {len(out[name]['items'])} items, {len(out[name]['nodes'])} nodes "
              f"(embedded in {out[name]['embed_s']} s)", file=sys.stderr, flush=True)
    return out


def unit(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


def shape(x: np.ndarray, rows: np.ndarray) -> dict:
    """PCA spectrum share, nearest-neighbour contrast, anisotropy, duplicates."""
    centred = x - x.mean(0)
    var = np.linalg.svd(centred, compute_uv=False) ** 2
    share = np.cumsum(var) / var.sum()
    d = np.sqrt(np.maximum(0.0, 2 - 2 * (x[rows] @ x.T)))  # unit vectors: distance from cosine
    d[np.arange(len(rows)), rows] = np.nan  # a query is not its own neighbour
    srt = np.sort(d, axis=1)  # NaN last
    mean = np.nanmean(d, axis=1)
    mdir = x.mean(0) / np.linalg.norm(x.mean(0))
    return {"pca_top10": round(float(share[min(9, len(share) - 1)]), 3),
            "pca_top48": round(float(share[min(47, len(share) - 1)]), 3),
            "nn1_over_mean": round(float(np.median(srt[:, 0] / mean)), 3),
            "nn10_over_mean": round(float(np.median(srt[:, K - 1] / mean)), 3),
            "cos_to_mean": round(float(np.mean(x @ mdir)), 3),
            "duplicates": round(float(np.mean(srt[:, 0] < 1e-3)), 3)}


def ivf_recall(x: np.ndarray, questions: np.ndarray | None, shards: int, target: float) -> dict:
    import faiss

    from canopy_ray.index.shards import RecallProbe, ShardedIndex, auto_nlist, recall

    index = ShardedIndex.build(x, shards, "ivf", recall_target=target)
    chosen = index.ivf_recall
    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    rows = RecallProbe.rows_for(len(x))
    own_exact = flat.search(x[rows], K + 1)[1]

    def others(pos):
        return np.stack([p[p != r][:K] for p, r in zip(pos, rows)])

    res = {"n": len(x), "nlist": auto_nlist(len(x)), "chosen_nprobe": chosen["nprobe"],
           "chosen_recall": chosen["recall"], "own": {}, "questions": {}}
    q_exact = flat.search(questions, K)[1] if questions is not None else None
    for p in NPROBES:
        index.set_nprobe(p)
        res["own"][str(p)] = round(recall(others(index.search(x[rows], K + 1)[1]), others(own_exact)), 4)
        if q_exact is not None:
            res["questions"][str(p)] = round(recall(index.search(questions, K)[1], q_exact), 4)
    res["shape"] = shape(x, rows)
    return res


def synthetic(n: int, dim: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    from scale import mixture, queries, vectors

    mix = mixture(dim)
    return vectors(mix, stream, n), queries(mix, QUESTIONS)


def measure(cfg, vecs: dict[str, dict]) -> dict:
    r = cfg.retrieval
    sets = dict(vecs)
    sets["all (open index)"] = {k: np.concatenate([v[k] for v in vecs.values()]) for k in ("items", "nodes",
                                                                                        "questions")}
    out = {}
    for name, v in sets.items():
        for kind in ("items", "nodes"):
            x = unit(v[kind])
            qs = unit(v["questions"]) if kind == "items" else None
            t = time.perf_counter()
            real = ivf_recall(x, qs, r.shards, r.recall_target)
            sx, sq = synthetic(len(x), x.shape[1], 0)
            syn = ivf_recall(sx, sq if kind == "items" else None, r.shards, r.recall_target)
            out[f"{name}/{kind}"] = {"set": name, "kind": kind, "real": real, "synthetic": syn}
            print(f"[ivf_real] {name} {kind}: n={len(x)} own recall {real['own']} vs synthetic {syn['own']} "
                  f"({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
    return out


def main() -> None:
    from canopy_ray.config import load_config
    from canopy_ray.data.sets import default_shared_root

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "cpu.yaml"))
    ap.add_argument("--items", type=int, default=200, help="items sampled (seeded) from each corpus")
    ap.add_argument("--shared-data", default=default_shared_root())
    ap.add_argument("--data-dir", type=Path, default=Path("runs/data"), help="converted sets (made if absent)")
    ap.add_argument("--work-dir", type=Path, default=Path("runs/bench-ivf-real"), help="embedded vectors, kept")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "bench" / "ivf_real.json")
    args = ap.parse_args()
    cfg = load_config(args.config)
    vecs = vectors_of(cfg, args)
    t0 = time.perf_counter()
    from canopy_ray.index.shards import RecallProbe

    res = {"config": Path(args.config).name, "items_per_corpus": args.items, "questions_per_corpus": QUESTIONS,
           "own_queries": RecallProbe.QUERIES,
           "target": cfg.retrieval.recall_target, "shards": cfg.retrieval.shards,
           "embed_s": {k: float(v["embed_s"]) for k, v in vecs.items()}, "sets": measure(cfg, vecs)}
    res["measure_s"] = round(time.perf_counter() - t0, 1)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(res, indent=1, sort_keys=True))
    scale_json = args.results.with_name("scale.json")
    if scale_json.is_file():  # scale.md shows ivf_real.json beside its own figures
        import scale

        scale.save(json.loads(scale_json.read_text()), scale_json)


if __name__ == "__main__":
    main()
