"""Floors and inputs the benchmarks share: the plain encoder loop, real questions with items, and
the Serve application under test on a free port of 127.0.0.1.

``plain_sorted_loop`` is the encoder's own speed on this machine: a plain transformers loop
over the packaged MiniLM (base weights: a merged LoRA costs the same), texts sorted by length,
fixed-size batches, mean pooling. Benchmarks measure the engine against it in the same run.
"""

from __future__ import annotations

import json
import os
import socket
import time
from importlib import resources
from pathlib import Path

SHARED = Path(os.environ.get("CANOPY_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def plain_sorted_loop(texts: list[str], max_length: int = 256, batch_size: int = 64) -> dict:
    """Encode ``texts`` once; ``{"seconds", "tokens"}`` (model loading not counted)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from canopy_ray.models.encoder import mean_pool, packaged_minilm_dir

    tok = AutoTokenizer.from_pretrained(packaged_minilm_dir(), local_files_only=True)
    model = AutoModel.from_pretrained(packaged_minilm_dir(), local_files_only=True).eval()
    order = sorted(texts, key=len)
    tokens = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(order), batch_size):
            batch = tok(order[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt")
            tokens += int(batch["attention_mask"].sum())
            mean_pool(model(**batch).last_hidden_state, batch["attention_mask"])
    return {"seconds": time.perf_counter() - t0, "tokens": tokens}


def question_items(n: int) -> list[tuple[str, list[dict]]]:
    """``(question, its gold items as canonical dicts)`` for ``n`` held-out HotpotQA questions:
    the test split of the shared dev set when ``../shared/data`` is there, else the bundled sample."""
    from canopy_ray.core.splits import in_split, sample_questions

    if (SHARED / "hotpotqa").is_dir():
        from canopy_ray.data.sets import prepare_shared

        d = prepare_shared(SHARED, Path("runs/bench-data"), ["hotpotqa"])["hotpotqa"]
        corpus, qfile = d / "corpus.jsonl", d / "questions.jsonl"
    else:
        sample = resources.files("canopy_ray") / "assets" / "sample"
        corpus, qfile = Path(str(sample / "corpus.jsonl")), Path(str(sample / "questions.jsonl"))
    items = {o["id"]: o for o in map(json.loads, corpus.read_text().splitlines()) if o.get("id")}
    from canopy_ray.core.items import parse_question

    qs = [parse_question(json.loads(line)) for line in qfile.read_text().splitlines() if line.strip()]
    qs = [q for q in in_split(qs, "test") if q.id and q.gold
          and all(g.item_id in items for g in q.gold) and q.gold[0].item_id.startswith("hotpotqa")]
    return [(q.question, [items[g.item_id] for g in q.gold]) for q in sample_questions(qs, n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cfg) -> str:
    """``cfg``'s application on its port; the server's root URL."""
    from ray import serve

    from canopy_ray.serve import build_app

    serve.start(http_options={"host": "127.0.0.1", "port": cfg.serve.port})
    serve.run(build_app({"cfg": cfg}), name="canopy", route_prefix="/")
    return f"http://127.0.0.1:{cfg.serve.port}"
