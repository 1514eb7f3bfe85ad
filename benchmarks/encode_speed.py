"""Encoder speed: TextEncoder against a plain sorted transformers loop, in the same run.

    python benchmarks/encode_speed.py --config configs/cpu.yaml [--repeats 3] [--out results/bench/encode_speed.md]

Texts: every node of every gold item of the held-out HotpotQA questions (test split of the
shared dev set, via ``prepare_shared`` + ``load_dataset`` + ``gold_items``) when
``../shared/data`` is there, else every node of the bundled sample corpus; each node as the
piece text the engine encodes (``piece(tree, [span]).text``).

Paths over the same texts:
(a) plain loop: ``floor.plain_sorted_loop`` with the model loaded once (transformers over the
    packaged MiniLM, texts sorted by length, ``models.batch_size`` rows per batch, mean pooling);
(b) ``TextEncoder.encode_nodes``: f_theta with the config's adapter, as the engine runs it;
(b') the same with the adapter's other serving form (merged copy vs PEFT LoRA branches);
(c) ``TextEncoder.encode_queries`` (f0) over the same texts;
(d) with ``--batch-tokens N,M,...``: (b) with other padded-token budgets per batch.

The machine is shared and its speed moves, so the paths are interleaved: the texts are cut
into chunks of ``--chunk-items`` items (an index job's batch), each chunk is encoded by every
path in turn (rotating the order), ``--repeats`` times; a path's time on a chunk is its fastest
repeat, and its speed is all tokens over the sum of those times. Read the ratios to (a): absolute
speeds differ from machine to machine and from minute to minute. Tokens are the real (unpadded)
tokens after truncation, the same for every path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from canopy_ray.config import load_config  # noqa: E402
from floor import SHARED  # noqa: E402


def node_texts(branching: int = 2) -> tuple[str, list[list[str]]]:
    """(where the texts come from, per item the texts of all its tree's nodes)."""
    from canopy_ray.core.evidence import piece
    from canopy_ray.core.hierarchy import build_tree

    if (SHARED / "hotpotqa").is_dir():
        from canopy_ray.core.splits import gold_items
        from canopy_ray.data.sets import load_dataset, prepare_shared

        d = prepare_shared(SHARED, Path("runs/bench-data"), ["hotpotqa"])["hotpotqa"]
        items, questions = load_dataset(d)
        trees, seen = [], set()
        for g in gold_items("hotpotqa", items, questions, split="test", branching=branching):
            if g.tree.item.id not in seen:
                seen.add(g.tree.item.id)
                trees.append(g.tree)
        source = f"gold paragraphs of the HotpotQA dev700 test-split questions ({SHARED})"
    else:
        from importlib import resources

        from canopy_ray.core.items import parse_item

        corpus = resources.files("canopy_ray") / "assets" / "sample" / "corpus.jsonl"
        lines = [json.loads(x) for x in corpus.read_text().splitlines() if x.strip()]
        trees = [build_tree(parse_item(o), branching) for o in lines]
        source = "the bundled sample corpus (no ../shared/data)"
    return source, [[piece(t, [n.span]).text for n in t.nodes()] for t in trees]


class PlainLoop:
    """``floor.plain_sorted_loop`` with the model loaded once (the encoder paths are loaded
    once too; a freshly loaded model's first batches are slower): transformers over the packaged
    MiniLM, texts sorted by length, fixed-size batches, mean pooling. Calls return seconds."""

    def __init__(self, max_length: int, batch_size: int):
        from transformers import AutoModel, AutoTokenizer

        from canopy_ray.models.encoder import packaged_minilm_dir

        self.tok = AutoTokenizer.from_pretrained(packaged_minilm_dir(), local_files_only=True)
        self.model = AutoModel.from_pretrained(packaged_minilm_dir(), local_files_only=True).eval()
        self.max_length, self.batch_size = max_length, batch_size

    def __call__(self, texts: list[str]) -> float:
        import torch

        from canopy_ray.models.encoder import mean_pool

        t0 = time.perf_counter()
        texts = sorted(texts, key=len)
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                b = self.tok(texts[i:i + self.batch_size], padding=True, truncation=True,
                             max_length=self.max_length, return_tensors="pt")
                mean_pool(self.model(**b).last_hidden_state, b["attention_mask"])
        return time.perf_counter() - t0


def _pieces(texts):
    from canopy_ray.core.evidence import Piece

    return [Piece("", "text", ((0, 1),), t) for t in texts]


def _timed(fn, texts) -> float:
    t0 = time.perf_counter()
    fn(texts)
    return time.perf_counter() - t0


def measure(paths: dict, chunks: list[list[str]], repeats: int) -> dict[str, float]:
    """Seconds per path: per chunk the fastest of ``repeats``, summed over chunks."""
    best = {name: [float("inf")] * len(chunks) for name in paths}
    names = list(paths)
    for r in range(repeats):
        for c, texts in enumerate(chunks):
            k = (r + c) % len(names)
            for name in names[k:] + names[:k]:
                best[name][c] = min(best[name][c], paths[name](texts))
    return {name: float(sum(v)) for name, v in best.items()}


def _with_budget(enc, budget: int):
    def run(texts):
        default, enc.batch_tokens = enc.batch_tokens, budget
        try:
            return _timed(enc.encode_nodes, _pieces(texts))
        finally:
            enc.batch_tokens = default
    return run


def chunked(per_item: list[list[str]], chunk_items: int) -> list[list[str]]:
    """The node texts of every ``chunk_items`` items: what one encode call gets."""
    return [[t for item in per_item[i:i + chunk_items] for t in item] for i in range(0, len(per_item), chunk_items)]


def spread_sample(texts: list[str], n: int) -> list[str]:
    """At most ``n`` texts spread evenly over ``texts``."""
    return texts[::max(1, len(texts) // max(1, n))][:n]


def max_diff_alone(encode, texts: list[str], wrap) -> float:
    """Largest difference between encoding ``texts`` together and each text alone."""
    together = encode(wrap(texts))
    alone = np.concatenate([encode(wrap([t])) for t in texts])
    return float(np.abs(together - alone).max())


def minilm_setup(p: argparse.ArgumentParser, argv, why: str):
    """``(args, cfg)``: arguments parsed, torch threads set, the config loaded; only for
    the MiniLM encoder (``why`` says why, otherwise)."""
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    if cfg.models.encoder != "minilm":
        p.error(why)
    return args, cfg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--repeats", type=int, default=3, help="passes over every chunk; the fastest counts")
    p.add_argument("--chunk-items", type=int, default=32, help="items whose nodes are encoded in one call")
    p.add_argument("--max-items", type=int, default=None, help="use the first N items only")
    p.add_argument("--check", type=int, default=120, help="texts checked against encoding each alone")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--batch-tokens", default="", help="other budgets to time encode_nodes with, e.g. 512,4096")
    p.add_argument("--out", default="results/bench/encode_speed.md")
    p.add_argument("--json", default="runs/bench-encode/results.json")
    args, cfg = minilm_setup(p, argv, "this benchmark compares the MiniLM TextEncoder with a plain loop "
                                      "over the same model")
    import torch

    from canopy_ray.models.encoder import TextEncoder, build_encoder

    m = cfg.models
    source, per_item = node_texts(cfg.hierarchy.branching)
    per_item = per_item[:args.max_items]
    chunks = chunked(per_item, args.chunk_items)
    texts = [t for c in chunks for t in c]

    enc = build_encoder(m)
    counts = enc.token_counts(_pieces(texts))
    tokens = sum(counts)
    padded = 0  # tokens the encoder's batches hold, padding included (each chunk is one call)
    for c in chunks:
        lengths = enc.token_counts(_pieces(c))
        padded += sum(len(b) * lengths[b[0]] for b in enc.batches(lengths))

    def form(e) -> str:
        return "merged copy" if e.node_model is not None else "PEFT LoRA branches"

    plain = f"(a) plain loop: transformers, sorted, batch {m.batch_size}"
    nodes = f"(b) TextEncoder.encode_nodes (f_theta, {form(enc)})"
    queries = "(c) TextEncoder.encode_queries (f0)"
    paths = {plain: PlainLoop(m.max_length, m.batch_size), nodes: lambda ts: _timed(enc.encode_nodes, _pieces(ts))}
    alt = other = None
    if enc.has_adapter:  # the adapter's other serving form, for comparison
        alt = TextEncoder(m.encoder_path, m.adapter, m.max_length, m.batch_size, m.device,
                          batch_tokens=enc.batch_tokens, merge_adapter=enc.node_model is None)
        other = f"(b') encode_nodes with the adapter as {form(alt)}"
        paths[other] = lambda ts: _timed(alt.encode_nodes, _pieces(ts))
    paths[queries] = lambda ts: _timed(enc.encode_queries, ts)
    for budget in [int(x) for x in args.batch_tokens.split(",") if x]:
        paths[f"(d) encode_nodes, batch_tokens {budget}"] = _with_budget(enc, budget)

    for fn in paths.values():  # warm-up: a model's first batches are slower
        fn(texts[:64])
    seconds = measure(paths, chunks, args.repeats)

    sample = sorted(spread_sample(texts, args.check), key=len)
    names = list(paths)
    diffs: dict[str, float | None] = dict.fromkeys(names)
    diffs[nodes] = max_diff_alone(enc.encode_nodes, sample, _pieces)
    if alt is not None:
        diffs[other] = float(np.abs(alt.encode_nodes(_pieces(sample)) - enc.encode_nodes(_pieces(sample))).max())
    diffs[queries] = max_diff_alone(enc.encode_queries, sample, list)

    floor = tokens / seconds[plain]
    lines = ["| path | tokens/s | x plain loop | seconds | max abs diff |", "|---|---|---|---|---|"]
    for name in names:
        d = diffs[name]
        lines.append(f"| {name} | {tokens / seconds[name]:.0f} | {tokens / seconds[name] / floor:.3f} | "
                     f"{seconds[name]:.2f} | {'' if d is None else f'{d:.1e}'} |")
    notes = (f"{len(texts)} node texts of {len(per_item)} items ({source}); {tokens} tokens after truncation at "
             f"{m.max_length}, {padded} padded in TextEncoder's batches of <= {m.batch_size} rows and "
             f"<= {enc.batch_tokens} padded tokens ({padded / tokens:.2f}x). Chunks of {args.chunk_items} items, "
             f"best of {args.repeats} interleaved passes; torch threads {torch.get_num_threads()}, "
             f"{os.cpu_count()} CPUs. Max abs diff: (b) and (c) against each of {len(sample)} texts encoded "
             f"alone; (b') against (b).")
    table = "\n".join(lines)
    print(table + "\n\n" + notes)
    cmd = "python benchmarks/encode_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"Measured by `{cmd.strip()}` on {os.cpu_count()} CPU cores, {date.today()}.\n\n"
                   f"{table}\n\n{notes}\n")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(
        {"tokens": tokens, "padded": padded, "texts": len(texts), "items": len(per_item), "source": source,
         "seconds": seconds, "tokens_per_s": {k: tokens / v for k, v in seconds.items()},
         "ratio_to_plain": {k: tokens / v / floor for k, v in seconds.items()}, "max_abs_diff": diffs,
         "config": args.config, "repeats": args.repeats, "chunk_items": args.chunk_items}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
