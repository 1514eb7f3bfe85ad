"""Training the cross-encoder node scorer (:class:`canopy_ray.models.cross.CrossScorer`).

Examples come from the training split only. Each preference node v of a gold item (CANOPY 3,
:func:`canopy_ray.core.pairs.preference_nodes`) gives the question with v and its children, their
preference pairs, and per node its gold overlap (the share of its leaves that are gold). Per
question, one internal node of a non-gold candidate with its children adds overlap-0 nodes, so
that leaves of other items rank below gold ones, as the hybrid's global ranking needs.

Loss per example: the paper's pairwise loss on the logits, ``log(1 + sum exp(s_b - s_a))``,
plus binary cross-entropy of each logit against the node's overlap. :func:`train_cross` runs it on Ray Train (``canopy train --scorer cross``), checkpointing the
weights and AdamW's moments as safetensors; the same run name resumes.
"""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from canopy_ray.core.evidence import node_text
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Item, Question
from canopy_ray.core.pairs import preference_nodes
from canopy_ray.core.splits import gold_items, in_split


@dataclass(frozen=True)
class Example:
    query: str
    texts: tuple[str, ...]  # v first, then its children
    overlap: tuple[float, ...]  # gold share of each node's leaves
    pairs: tuple[tuple[int, int], ...]  # (winner, loser) into texts


def examples_for(dataset: str, items: Mapping[str, Item], questions: Sequence[Question],
                 split: str, branching: int = 2, seed: int = 0) -> list[Example]:
    """Preference examples of the gold items, and one overlap-0 example per question from a
    non-gold candidate (seeded)."""
    rng = random.Random(seed)
    out = []
    for gi in gold_items(dataset, items, questions, split, branching):
        for pn in preference_nodes(gi.tree.root, gi.gold):
            spans = (pn.node.span,) + tuple(c.span for c in pn.node.children)
            at = {s: k for k, s in enumerate(spans)}
            out.append(Example(gi.question.question, tuple(node_text(gi.tree, s) for s in spans),
                               tuple(sum(i in gi.gold for i in range(*s)) / (s[1] - s[0]) for s in spans),
                               tuple((at[p.winner], at[p.loser]) for p in pn.pairs)))
    for q in in_split(questions, split):
        gold_ids = {g.item_id for g in q.gold}
        others = [c for c in q.candidates if c not in gold_ids and c in items]
        if not others:
            continue
        tree = build_tree(items[rng.choice(others)], branching)
        inner = [n for n in tree.nodes() if not n.is_leaf]
        if not inner:
            continue
        v = rng.choice(inner)
        spans = (v.span,) + tuple(c.span for c in v.children)
        out.append(Example(q.question, tuple(node_text(tree, s) for s in spans), (0.0,) * len(spans), ()))
    return out


def example_loss(logits: torch.Tensor, ex: Example) -> torch.Tensor:
    """Pairwise preference loss plus per-node BCE against the gold overlap."""
    target = torch.tensor(ex.overlap, dtype=logits.dtype, device=logits.device)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
    if ex.pairs:
        from canopy_ray.train.loss import pair_loss

        loss = loss + pair_loss(logits, ex.pairs)
    return loss


def batch_loss(model, batch: Sequence[Example], chunk_tokens: int = 2048) -> torch.Tensor:
    from canopy_ray.models.batching import length_batches

    rows = [r for ex in batch for r in model.pair_rows(ex.query, ex.texts)]
    parts, index = [], []
    for chunk in length_batches([len(r) for r in rows], len(rows), chunk_tokens):  # little padding
        parts.append(model.logits([rows[i] for i in chunk]))
        index += chunk
    logits = torch.empty(len(rows), dtype=parts[0].dtype).index_copy(0, torch.tensor(index), torch.cat(parts))
    at, losses = 0, []
    for ex in batch:
        losses.append(example_loss(logits[at:at + len(ex.texts)], ex))
        at += len(ex.texts)
    return torch.stack(losses).mean()


def step_examples(n: int, epochs: float, batch_size: int, seed: int) -> list[np.ndarray]:
    """The global batches of a run (indexes): a seeded permutation per epoch, ``epochs`` of them
    (a fraction: the first part of the last), cut into ``batch_size``; a short tail is dropped."""
    order = np.concatenate([np.random.default_rng(seed + e).permutation(n) for e in range(int(np.ceil(epochs)))])
    order = order[: int(epochs * n)]
    return [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]


def save_checkpoint(model, opt, step: int, path: Path, loss: float) -> None:
    """The scorer, AdamW's moments (safetensors) and the step, so a run resumes exactly."""
    from safetensors.torch import save_file

    model.save(path)
    names = {id(p): n for n, p in model.named_parameters()}
    moments = {}
    for p, st in opt.state.items():
        moments[names[id(p)] + ":m"] = st["exp_avg"].contiguous()
        moments[names[id(p)] + ":v"] = st["exp_avg_sq"].contiguous()
    save_file(moments, str(path / "adam.safetensors"))
    (path / "state.json").write_text(json.dumps({"step": step, "loss": loss}))


def load_checkpoint(model, opt, path: Path) -> int:
    from safetensors.torch import load_file

    step = json.loads((path / "state.json").read_text())["step"]
    moments = load_file(str(path / "adam.safetensors"))
    for n, p in model.named_parameters():
        if n + ":m" in moments:
            opt.state[p] = {"step": torch.tensor(float(step)), "exp_avg": moments[n + ":m"],
                            "exp_avg_sq": moments[n + ":v"]}
    return step


def cross_loop(config: dict) -> None:
    """One Ray Train worker. Each global batch is dealt over the workers (``rank::world``); each
    loss is divided by the global batch size and the gradients summed over the workers, so the
    update is the same for any number of workers. Rank 0 checkpoints every ``checkpoint_every``
    steps; a restarted run continues from Ray Train's latest checkpoint."""
    import tempfile
    import time

    import ray.train

    from canopy_ray.models.cross import CrossScorer
    from canopy_ray.train.loop import lr_factor

    t = config["recipe"]
    torch.set_num_threads(config["threads"])
    torch.manual_seed(config["seed"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    examples = [Example(q, tuple(x), tuple(o), tuple(map(tuple, p))) for q, x, o, p in config["examples"]]
    batches = step_examples(len(examples), t["epochs"], t["batch_size"], config["seed"])
    total = min(len(batches), config["max_steps"] or len(batches))
    ckpt = ray.train.get_checkpoint()
    with ckpt.as_directory() if ckpt else contextlib.nullcontext() as d:
        model = CrossScorer(d, tuned_layers=t["tuned_layers"], max_length=t["max_length"])
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=t["lr"], weight_decay=0.01)
        step = start = load_checkpoint(model, opt, Path(d)) if d else 0
    model.train()
    losses, t0 = [], time.perf_counter()
    while step < total:
        for g in opt.param_groups:
            g["lr"] = t["lr"] * lr_factor(step, total, t["warmup"], "linear")
        mine = [examples[i] for i in batches[step][rank::world]]
        loss = batch_loss(model, mine) * (len(mine) / len(batches[step])) if mine else None
        if loss is not None:
            loss.backward()
        if world > 1:
            for p in model.parameters():
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    torch.distributed.all_reduce(p.grad)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        step += 1
        losses.append(float(loss) * world if loss is not None else float("nan"))
        if step % config["checkpoint_every"] == 0 or step == total:
            metrics = {"step": step, "loss": float(np.nanmean(losses)), "start_step": start,
                       "train_s": time.perf_counter() - t0, "total_steps": total}
            with tempfile.TemporaryDirectory() as tmp:
                if rank == 0:
                    save_checkpoint(model, opt, step, Path(tmp), metrics["loss"])
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None)
            losses = []


def train_cross(cfg, data_dirs: Mapping[str, str | Path] | None, storage_path: str | Path, name: str,
                out_dir: str | Path | None = None, *, max_steps: int | None = None, checkpoint_every: int = 100,
                examples: Sequence[Example] | None = None):
    """Train the cross-encoder on the ``train`` split of the named canonical data directories (or on
    ``examples``) with Ray Train; the same ``storage_path`` and ``name`` resume. The scorer goes to
    ``out_dir`` (default ``<storage>/<name>/scorer``)."""
    import shutil
    import time

    from canopy_ray.data.sets import load_dataset
    from canopy_ray.train.fit import TrainResult, fit_on_ray

    t0, tc = time.perf_counter(), cfg.training
    if examples is None:
        examples = []
        for ds in sorted(data_dirs):
            items, questions = load_dataset(data_dirs[ds])
            examples += examples_for(ds, items, questions, "train", cfg.hierarchy.branching, tc.seed)
    config = {"recipe": tc.cross.model_dump(), "threads": tc.threads, "seed": tc.seed, "max_steps": max_steps,
              "checkpoint_every": checkpoint_every,
              "examples": [(e.query, e.texts, e.overlap, e.pairs) for e in examples]}
    result = fit_on_ray(cross_loop, config, tc, storage_path, name)
    out = Path(out_dir) if out_dir else Path(storage_path) / name / "scorer"
    out.mkdir(parents=True, exist_ok=True)
    with result.checkpoint.as_directory() as d:
        for f in ("scorer.safetensors", "scorer.json"):
            shutil.copy2(Path(d) / f, out / f)
    m = result.metrics or {}
    return TrainResult(out, int(m.get("step", 0)), len(examples), float(m.get("loss", "nan")),
                       float(m.get("train_s", 0.0)), time.perf_counter() - t0, result.checkpoint.path,
                       int(m.get("start_step", 0)))
