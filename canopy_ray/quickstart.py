"""``canopy quickstart``: index the bundled sample, serve it, ask it, show the forests.

Starts a local Ray, runs the Ray Data index job on the sample corpus (resuming a finished
index), starts the Serve application on 127.0.0.1, asks a handful of sample questions over
HTTP with ``explain``, prints each answer with its evidence forest, rounds, LLM calls and
tokens, writes ``report.html`` (each item's tree, kept and dropped regions) and shuts down.
"""

from __future__ import annotations

import html
import json
import socket
import time
from importlib import resources
from pathlib import Path

import httpx

from canopy_ray.compressor import ItemResult, format_forest
from canopy_ray.config import CanopyConfig, load_config
from canopy_ray.core.files import write_json, write_text
from canopy_ray.core.evidence import node_text
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Item, parse_question

SAMPLE = resources.files("canopy_ray") / "assets" / "sample"
# One question per source (HotpotQA, NQ, TAT-QA) and one for the media items.
DEFAULT_QUESTIONS = 4


def _free_port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_questions(path: Path, n: int) -> list[dict]:
    """The first question of each source in turn, then the media question, up to ``n``."""
    qs = [parse_question(json.loads(line)) for line in path.open() if line.strip()]
    by_source: dict[str, list] = {}
    for q in qs:  # item ids start with their source: "hotpotqa:", "nq:", "tatqa:"
        by_source.setdefault(q.gold[0].item_id.split(":")[0], []).append(q)
    picked = [{"question": v[0].question, "answers": list(v[0].answers)} for v in by_source.values()]
    picked.append({"question": "What stands on the launch pad at dusk?", "answers": ["a rocket"]})
    return picked[:n]


def _result(item: Item, explained: dict, cfg: CanopyConfig) -> ItemResult:
    """An item's result from the server's ``explain`` JSON; its tree built as the server built it."""
    h = cfg.hierarchy
    whole = len(explained["nodes"]) == 1
    tree = build_tree(item, h.branching, h.segment_s, h.frame_every_s, h.max_frames, whole=whole)
    return ItemResult.from_dict(tree, explained)


def _html_item(r: ItemResult) -> str:
    def node(n) -> str:
        fate = r.decisions[n.span]
        text = html.escape(node_text(r.tree, n.span))
        label = f"{n.span[0]}&ndash;{n.span[1]} &middot; {r.scores[n.span]:+.4f} &middot; {fate}"
        kids = "".join(node(c) for c in n.children) if fate == "split" else ""
        return (f'<li class="{fate}"><span class="tag">{label}</span>'
                f'<div class="text">{text}</div>{"<ul>" + kids + "</ul>" if kids else ""}</li>')

    return (f"<h3>{html.escape(r.id)} ({r.tree.item.modality}): {r.tokens_before} &rarr; {r.tokens_after} "
            f"tokens</h3><ul>{node(r.tree.root)}</ul>")


PAGE = """<!doctype html><meta charset="utf-8"><title>canopy-ray quickstart</title>
<style>body{{font:14px sans-serif;max-width:1000px;margin:2em auto}} ul{{list-style:none;padding-left:1.4em}}
li{{margin:.3em 0;border-left:3px solid #ccc;padding-left:.5em}} .kept{{border-color:#2a2;background:#efe}}
.dropped{{border-color:#c44;color:#999}} .dropped .text{{text-decoration:line-through}} .split>.text{{display:none}}
.tag{{font:12px monospace;color:#555}} .answer{{font-size:18px}}</style>
<h1>canopy-ray quickstart</h1><p>Green: kept; red, struck out: dropped (scored below its parent);
split nodes show their children. {summary}</p>{body}"""


def run(cfg: CanopyConfig | None = None, out_dir: str | Path = "runs/quickstart", n_questions: int = DEFAULT_QUESTIONS,
        corpus: str | Path | None = None, questions: list[dict] | None = None, port: int = 8000,
        echo=print) -> dict:
    import ray
    from ray import serve

    from canopy_ray.index import load_index
    from canopy_ray.indexer import run_index
    from canopy_ray.serve import build_app

    t0 = time.perf_counter()
    cfg = cfg or load_config()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = Path(corpus) if corpus else Path(str(SAMPLE / "corpus.jsonl"))
    questions = questions or demo_questions(Path(str(SAMPLE / "questions.jsonl")), n_questions)
    echo(f"[1/3] indexing {corpus} with the Ray Data job")
    # Without a running Ray, the job starts its own and stops it, so no Ray Data actor
    # outlives it to hold the CPUs the Serve replicas need.
    summary = run_index(cfg, corpus, out / "index", media_root=corpus.parent, progress=True, num_cpus=2)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = _free_port(port)
        cfg = cfg.override(serve={"index_dir": str(out / "index"), "media_root": str(corpus.parent), "port": port})
        echo(f"[2/3] starting the Serve application on http://127.0.0.1:{port}")
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app({"cfg": cfg}), name="canopy", route_prefix="/")
        index = load_index(out / "index")  # the items as indexed (a corpus may repeat an id; the first counts)
        echo(f"[3/3] asking {len(questions)} questions")
        records, blocks = [], []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            for q in questions:
                r = client.post("/v1/answer", json={"question": q["question"], "explain": True})
                r.raise_for_status()
                ans = r.json()
                results = [_result(index.item(e["id"]), e, cfg) for e in ans["items"]]
                echo(f"\nQ: {q['question']}\nA: {ans['answer']!r}   (gold: {', '.join(q.get('answers', []))})")
                echo(f"rounds {ans['rounds']}, LLM calls {ans['llm_calls_total']} {ans['llm_calls']}, tokens "
                     f"{ans['tokens']['before']} -> {ans['tokens']['after']} (reader {ans['tokens']['reader']})")
                for res in results:
                    echo(format_forest(res))
                records.append({"question": q, "response": ans})
                blocks.append(f"<h2>{html.escape(q['question'])}</h2><p class='answer'>Answer: "
                              f"<b>{html.escape(ans['answer'])}</b> (gold: {html.escape(', '.join(q.get('answers', [])))})"
                              f" &middot; rounds {ans['rounds']} &middot; LLM calls {ans['llm_calls_total']} &middot; "
                              f"tokens {ans['tokens']['before']} &rarr; {ans['tokens']['after']}</p>"
                              + "".join(_html_item(res) for res in results))
    finally:
        serve.shutdown()
        if started:
            ray.shutdown()
    seconds = time.perf_counter() - t0
    write_json(out / "answers.json", records)
    page = PAGE.format(summary=html.escape(f"{summary['items']} items indexed; {len(questions)} questions; "
                                           f"{seconds:.0f} s in all."), body="".join(blocks))
    write_text(out / "report.html", page)
    echo(f"\nwrote {out / 'report.html'} and {out / 'answers.json'} ({seconds:.0f} s)")
    return {"records": records, "index": summary, "seconds": seconds, "report": str(out / "report.html")}
