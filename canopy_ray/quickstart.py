"""``canopy quickstart``: index the bundled sample, serve it, ask it, show the forests.

Starts a local Ray, runs the Ray Data index job on the sample corpus (resuming a finished
index; rebuilding one made with other settings or older code), starts the Serve application on
127.0.0.1 and asks a handful of sample questions over HTTP with ``explain``. For each question it
prints what the engine guarantees first, whether a gold answer survived compression into the kept
evidence (answer recall), the tokens before and after and what the node encoder read, the time
per stage, then the reader's answer, labelled with the model that gave it (the CPU default is
SmolLM2-135M, a weak reader): a reply that did not parse, or that the evidence does not contain,
is shown as "no answer" with the reason. Then each item's evidence forest. ``report.html`` (rendered from
``assets/templates/quickstart.html.j2``) shows the same; ``answers.json`` keeps the raw responses.
"""

from __future__ import annotations

import json
import socket
import time
from importlib import resources
from pathlib import Path

import httpx

from canopy_ray.compressor import ItemResult, format_forest
from canopy_ray.config import CanopyConfig, load_config
from canopy_ray.core.evidence import node_text
from canopy_ray.core.files import write_json, write_text
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Item, parse_question
from canopy_ray.core.metrics import answer_recall, normalize_answer
from canopy_ray.models.llm.endpoint import reader_override  # noqa: F401 (the quickstart's --llm-url)

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


# ---------------------------------------------------------------- the reader and its answers

LOCAL_READER = "SmolLM2-135M, CPU"


def reader_label(cfg: CanopyConfig) -> str:
    """Who answers: the local CPU model, or the endpoint's model."""
    if cfg.llm.backend == "local":
        return LOCAL_READER
    return f"{cfg.llm.model or 'default model'} at {cfg.llm.url}"


def judge_answer(response: dict, evidence: str) -> tuple[str | None, str]:
    """``(answer, "")`` for a reply worth showing, else ``(None, reason)``: the reader's reply did
    not parse (``llm_failures`` counts it), was empty, or is not in the evidence it was given
    (yes/no excepted). Raw unparsed text is never shown as an answer."""
    if response.get("llm_failures", {}).get("reader"):
        return None, "the reader's reply was not the answer JSON (failed to parse)"
    answer = (response.get("answer") or "").strip()
    if not normalize_answer(answer):
        return None, "the reader gave an empty answer"
    if normalize_answer(answer) not in ("yes", "no") and not answer_recall(evidence, [answer]):
        return None, "the reader's reply does not occur in the evidence"
    return answer, ""


def _stage(name: str) -> str:
    return f"{name[4:]} LLM" if name.startswith("llm_") else name


def summarize(question: dict, response: dict, reader: str) -> dict:
    """What one question shows, on the console and in report.html."""
    gold = list(question.get("answers", []))
    pieces = response.get("evidence", [])
    evidence = "\n".join(p["text"] for p in pieces)
    body = "\n".join(p["text"][len(p.get("head", "")):] for p in pieces)  # titles left out
    answer, reason = judge_answer(response, evidence)
    tok = response.get("tokens", {})
    before, after = tok.get("before", 0), tok.get("after", 0)
    timings = dict(response.get("timings", {}))
    total = timings.pop("total", None)
    return {
        "question": question["question"], "gold": gold,
        "recall": bool(gold) and bool(answer_recall(body, gold)),
        "tokens": {"before": before, "after": after, "reader": tok.get("reader", 0),
                   "saved": 1 - after / before if before else 0.0, "encoded": tok.get("encoded"),
                   "nodes_encoded": tok.get("nodes_encoded"), "nodes_total": tok.get("nodes_total")},
        "timings": [(_stage(k), v) for k, v in timings.items()], "total_s": total,
        "reader": reader, "answer": answer, "reason": reason,
        "correct": answer is not None and bool(gold) and bool(answer_recall(answer, gold)),
        "rounds": response.get("rounds"), "llm_calls": response.get("llm_calls", {}),
        "llm_failures": response.get("llm_failures", {}),
    }


def format_summary(v: dict) -> list[str]:
    """The console lines of one question (before its forests)."""
    t = v["tokens"]
    gold = ", ".join(v["gold"]) or "none given"
    lines = [f"\nQ: {v['question']}",
             f"   gold answer in the kept evidence (titles aside): {'yes' if v['recall'] else 'no'}   (gold: {gold})",
             f"   tokens: {t['before']} retrieved -> {t['after']} kept ({t['saved']:.0%} fewer); "
             f"the reader read {t['reader']}"]
    if t["encoded"] is not None:
        lines.append(f"   node encoder: {t['nodes_encoded']} of {t['nodes_total']} nodes encoded now ({t['encoded']} "
                     "tokens); the others were stored at indexing, cached, or never visited")
    stages = ", ".join(f"{k} {s:.2f} s" for k, s in v["timings"])
    total = f"; total {v['total_s']:.2f} s" if v["total_s"] is not None else ""
    lines.append(f"   time: {stages}{total}")
    if v["answer"] is None:
        lines.append(f"   answer ({v['reader']}): no answer ({v['reason']})")
    else:
        verdict = "matches a gold answer" if v["correct"] else "not a gold answer"
        lines.append(f"   answer ({v['reader']}): {v['answer']}   ({verdict})")
    calls = ", ".join(f"{k} {n}" for k, n in v["llm_calls"].items())
    lines.append(f"   rounds {v['rounds']}; LLM calls: {calls or 'none'}")
    return lines


def format_totals(views: list[dict], reader: str, local: bool) -> list[str]:
    n = len(views)
    before = sum(v["tokens"]["before"] for v in views)
    after = sum(v["tokens"]["after"] for v in views)
    lines = [f"\ngold answer in the kept evidence (titles aside): {sum(v['recall'] for v in views)} of {n} questions "
             f"({before} -> {after} tokens, {1 - after / before if before else 0:.0%} fewer)",
             f"reader answers that match a gold answer: {sum(v['correct'] for v in views)} of {n} ({reader})"]
    if local:
        lines.append("SmolLM2-135M is a weak reader, here so that the quickstart runs on any CPU; the evidence "
                     "lines are the engine's part. Bring a real model: canopy quickstart --llm-url URL "
                     "[--llm-model M] (any OpenAI-compatible server, e.g. http://127.0.0.1:8001/v1)")
    return lines


def _tree(r: ItemResult) -> dict:
    """An item's visited nodes as nested dicts for the template (children of split nodes only)."""
    def node(n) -> dict:
        fate = r.decisions[n.span]
        score = r.scores.get(n.span)
        return {"span": n.span, "score": None if score is None else f"{score:+.4f}", "fate": fate,
                "text": node_text(r.tree, n.span),
                "children": [node(c) for c in n.children] if fate == "split" else []}

    return {"id": r.id, "modality": r.tree.item.modality, "tokens_before": r.tokens_before,
            "tokens_after": r.tokens_after, "root": node(r.tree.root)}


def render_report(views: list[dict], summary: str, reader: str, local: bool) -> str:
    """report.html from the package's jinja2 template (autoescaped)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("canopy_ray", "assets/templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("quickstart.html.j2").render(questions=views, summary=summary, reader=reader,
                                                         local=local, totals=format_totals(views, reader, local))


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
    reader, local = reader_label(cfg), cfg.llm.backend == "local"
    echo(f"[1/3] indexing {corpus} with the Ray Data job")
    # Without a running Ray, the job starts its own and stops it, so no Ray Data actor
    # outlives it to hold the CPUs the Serve replicas need.
    # the index is this command's own, so one made with other settings is rebuilt, not refused
    summary = run_index(cfg, corpus, out / "index", media_root=corpus.parent, overwrite=True, progress=True,
                        num_cpus=2)
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
        echo(f"[3/3] asking {len(questions)} questions; reader and critic: {reader}")
        records, views = [], []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            for q in questions:
                r = client.post("/v1/answer", json={"question": q["question"], "explain": True})
                r.raise_for_status()
                ans = r.json()
                results = [_result(index.item(e["id"]), e, cfg) for e in ans["items"]]
                view = summarize(q, ans, reader)
                for line in format_summary(view):
                    echo(line)
                for res in results:
                    echo(format_forest(res))
                records.append({"question": q, "response": ans})
                views.append(view | {"items": [_tree(res) for res in results]})
    finally:
        serve.shutdown()
        if started:
            ray.shutdown()
    seconds = time.perf_counter() - t0
    for line in format_totals(views, reader, local):
        echo(line)
    write_json(out / "answers.json", records)
    page = render_report(views, f"{summary['items']} items indexed; {len(questions)} questions; "
                                f"{seconds:.0f} s in all.", reader, local)
    write_text(out / "report.html", page)
    echo(f"\nwrote {out / 'report.html'} and {out / 'answers.json'} ({seconds:.0f} s)")
    return {"records": records, "views": views, "index": summary, "seconds": seconds,
            "report": str(out / "report.html")}
