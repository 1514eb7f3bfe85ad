"""The Ray Train loop: LoRA on the node encoder against frozen f0 query vectors.

:class:`Worker` runs on every Ray Train worker (:func:`canopy_ray.trainer.train_loop`). ``config`` (the data part built by
:func:`canopy_ray.train.prepare.prepare`, plus ``max_steps``, ``checkpoint_every`` and
``time_budget_s`` from :func:`canopy_ray.trainer.train`) carries the training section, the
encoder directory, the f0 query vectors (computed once, without gradients, before
training), the paths of the cached bottom-layer states and the instances as plain tuples
``(query_row, node_rows, pairs)``.

Data parallelism: each epoch the instances are shuffled with ``seed + epoch``; a global
batch of ``batch_size`` instances is dealt round-robin over the workers and DDP averages
their gradients, so the optimisation does not depend on the number of workers. Every
``checkpoint_every`` steps (and at the end) rank 0 writes a checkpoint (adapter +
optimizer + step) and all workers report. On a restart with the same storage path and
run name, ``ray.train.get_checkpoint()`` returns the latest checkpoint and the loop
continues from its step, skipping the batches of the epoch already done. With a time
budget, the workers agree (all_reduce) to stop at the same step.

The learning rate follows ``training.schedule`` after ``training.warmup`` (:func:`lr_factor`,
a function of the step, so a resumed run continues it). With ``training.val_items`` each
checkpoint is also scored on validation gold items (decision accuracy and gold recall per
family, :mod:`canopy_ray.train.validation`): the curve goes to ``<run>/curve.json`` and
``curve.png``, the best checkpoint by the recall-protecting rule to ``<run>/best/``, and
``training.patience`` validations without a better one stop the run.
"""

from __future__ import annotations

import tempfile
import time
from typing import Sequence

import numpy as np
import torch


def lr_factor(step: int, total: int, warmup: float = 0.0, schedule: str = "constant") -> float:
    """The learning-rate multiplier of (0-based) ``step`` of ``total``: linear warm-up over the
    first ``warmup`` share of the steps, then constant, linear or cosine decay toward 0.
    Stateless, so a resumed run continues the same schedule from its step."""
    n_warm = int(round(warmup * total))
    if step < n_warm:
        return (step + 1) / n_warm
    if schedule == "constant" or total <= n_warm:
        return 1.0
    x = (step - n_warm) / max(total - n_warm, 1)
    return 1.0 - x if schedule == "linear" else 0.5 * (1.0 + float(np.cos(np.pi * x)))


def step_batches(n: int, batch_size: int, epoch: int, seed: int, world: int) -> list[np.ndarray]:
    """The global batches of one epoch (index arrays); a tail smaller than ``world`` is dropped."""
    order = np.random.default_rng(seed + epoch).permutation(n)
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    return [b for b in batches if len(b) >= world]


TRAIN_CHUNK = 16  # node texts per length-sorted chunk of a step (canopy_ray.train.cached.encode_rows)


def cached_loss(top, states, offsets, queries: torch.Tensor, instances, rows: Sequence[int],
                lam: float) -> torch.Tensor:
    """Mean loss of the given instances ``(query_row, node_rows, pairs)`` over cached bottom
    states; each distinct node row runs through the top layers once."""
    from canopy_ray.train.cached import encode_rows
    from canopy_ray.train.loss import batch_loss

    nodes: dict[int, int] = {}
    q_rows: dict[int, int] = {}
    groups = []
    for r in rows:
        qi, node_rows, pairs = instances[r]
        q_rows.setdefault(qi, len(q_rows))
        groups.append((q_rows[qi], [nodes.setdefault(n, len(nodes)) for n in node_rows], pairs))
    node_vecs = encode_rows(top, states, offsets, list(nodes), TRAIN_CHUNK)
    return batch_loss(queries[list(q_rows)], node_vecs, groups, lam)


def eval_mode_except_lora_dropout(model) -> None:
    """Train mode for the LoRA dropout only: the base model's own dropout stays off, as in
    the cached bottom layers (frozen, deterministic)."""
    model.train()
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout) and "lora_dropout" not in name:
            m.eval()


class Worker:
    """One Ray Train worker: LoRA on the top ``lora_layers`` layers, trained on cached
    bottom-layer states (:mod:`canopy_ray.train.cached`)."""

    def __init__(self, config: dict):
        import ray.train

        t = config["training"]
        torch.set_num_threads(int(t.get("threads") or 1))
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.seed, self.batch_size, self.lam = t["seed"], t["batch_size"], t["temperature"]
        self.resume_from = config.get("resume_from")  # the trainer's pick past a torn Ray record
        self._setup_model(t, config.get("encoder_path"))
        self.states, self.offsets, self.queries = _part_arrays(config)
        self.instances = config["instances"]
        self.val = config.get("val")
        if self.val:
            self.v_states, self.v_offsets, self.v_queries = _part_arrays(self.val)
        self.gold_val = config.get("gold_val")
        if self.gold_val:
            self.g_states, self.g_offsets, self.g_queries = _part_arrays(self.gold_val)
        self.lr, self.warmup = t["lr"], t.get("warmup", 0.0)
        self.schedule = t.get("schedule", "constant")
        self.tolerance, self.patience = t.get("recall_tolerance", 0.0), t.get("patience")
        self.run_dir = config.get("run_dir")
        self.curve: list[dict] = []
        self.gold_metrics: dict = {}  # of the last validation (reported again at the end)
        self.last_loss = float("nan")
        self.stopped = False  # early stopping (no better checkpoint for ``patience`` validations)
        self.n = len(self.instances)
        self.per_epoch = len(step_batches(self.n, self.batch_size, 0, self.seed, self.world))
        self.total = self.per_epoch * t["epochs"]
        if config.get("max_steps"):
            self.total = min(self.total, int(config["max_steps"]))
        self.budget = config.get("time_budget_s")
        self.every = int(config.get("checkpoint_every") or self.per_epoch)
        self.losses: list[float] = []

    def _setup_model(self, t: dict, encoder_path) -> None:
        """The LoRA model, its optimizer and step state (from the checkpoint, if any), and
        the DDP-wrapped top layers."""
        import ray.train
        import ray.train.torch

        from canopy_ray.train.cached import TopEncoder
        from canopy_ray.train.lora import TrainState, load_base, load_checkpoint, lora_model, n_layers

        torch.manual_seed(t["seed"])
        _, base = load_base(encoder_path)
        total_layers = n_layers(base)
        top_layers = t.get("lora_layers") or total_layers
        n_bottom = total_layers - min(top_layers, total_layers)
        self.model = lora_model(base, t["lora_rank"], t["lora_alpha"], t["lora_dropout"], top_layers)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                           lr=t["lr"])
        self.state = TrainState()
        ckpt = self.checkpoint()
        if ckpt is not None:
            with ckpt.as_directory() as d:
                self.state = load_checkpoint(self.model, self.optimizer, d)
        self.start_step = self.state.step
        self.top = ray.train.torch.prepare_model(TopEncoder(self.model, n_bottom))
        eval_mode_except_lora_dropout(self.model)

    def checkpoint(self):
        """The run's newest checkpoint Ray Train registered, else the one the trainer found
        past a torn record of Ray's (:func:`canopy_ray.trainer.train`), else None."""
        import ray.train

        ckpt = ray.train.get_checkpoint()
        if ckpt is None and self.resume_from:
            ckpt = ray.train.Checkpoint.from_directory(self.resume_from)
        return ckpt

    def run(self) -> None:
        """Validate f0 (a fresh run), train the remaining steps, report the final checkpoint."""
        if self.val and self.start_step == 0 and self.rank == 0:
            print(f"step 0 (f0): validation decision accuracy {self.validate():.4f}", flush=True)
        if self.gold_val:
            self.start_curve()
        epoch = self.state.step // self.per_epoch if self.per_epoch else 0
        while self.state.step < self.total and self.run_epoch(epoch):
            epoch += 1
        self.report(final=True)

    def run_epoch(self, epoch: int) -> bool:
        """The batches of ``epoch`` not done yet; False when the time budget ran out."""
        batches = step_batches(self.n, self.batch_size, epoch, self.seed, self.world)
        for b in batches[self.state.step - epoch * self.per_epoch:]:
            if self.state.step >= self.total:
                break
            self.step(b[self.rank::self.world].tolist())
            if self.out_of_time():
                return False
            if self.state.step % self.every == 0 and self.state.step < self.total:
                self.report()
                if self.stopped:
                    return False
        return True

    def step(self, rows: list[int]) -> None:
        """One optimisation step on this worker's share of a global batch."""
        t0 = time.perf_counter()
        loss = self.batch_loss(rows)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr * lr_factor(self.state.step, self.total, self.warmup, self.schedule)
        self.optimizer.step()
        self.state.step += 1
        self.state.train_s += time.perf_counter() - t0
        self.losses.append(float(loss.detach()))
        if self.rank == 0 and self.state.step % 10 == 0:
            s_per_step = self.state.train_s / max(self.state.step - self.start_step, 1)
            print(f"step {self.state.step}/{self.total} loss {np.mean(self.losses[-10:]):.4f} "
                  f"{s_per_step:.2f} s/step", flush=True)

    def batch_loss(self, rows: list[int]) -> torch.Tensor:
        """Mean loss of the instances ``rows`` (through the top layers over cached states)."""
        return cached_loss(self.top, self.states, self.offsets, self.queries, self.instances,
                           rows, self.lam)

    def encode_part(self, part: dict, states, offsets) -> torch.Tensor:
        """Node vectors (no gradients) of every node text of a validation part."""
        from canopy_ray.train.cached import encode_rows

        return encode_rows(self.top, states, offsets, list(range(len(offsets) - 1)), 64)

    def out_of_time(self) -> bool:
        """Whether the time budget is spent on any worker (all workers stop at the same step)."""
        if not self.budget:
            return False
        flag = torch.tensor([float(self.state.train_s >= self.budget)])
        if self.world > 1:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return flag.item() > 0

    def validate(self) -> float | None:
        """Decision accuracy on the validation instances (None without them)."""
        from canopy_ray.train.cached import decision_accuracy

        if not self.val:
            return None
        self.model.eval()
        with torch.no_grad():
            vecs = self.encode_part(self.val, self.v_states, self.v_offsets)
        eval_mode_except_lora_dropout(self.model)
        return decision_accuracy(vecs, self.v_queries, self.val["instances"])

    def gold_report(self, adapter: bool = True) -> dict:
        """Decision accuracy and gold recall per family on the validation gold items
        (:mod:`canopy_ray.train.validation`), with the adapter or as f0."""
        import contextlib

        from canopy_ray.train.validation import score_report

        self.model.eval()
        ctx = contextlib.nullcontext() if adapter else self.model.disable_adapter()
        with torch.no_grad(), ctx:
            vecs = self.encode_part(self.gold_val, self.g_states, self.g_offsets)
        eval_mode_except_lora_dropout(self.model)
        return score_report(self.gold_val["items"], vecs.float().cpu().numpy(),
                            self.g_queries.numpy())

    def start_curve(self) -> None:
        """The curve so far (a resumed run keeps its entries up to its step) or f0's entry."""
        import json
        from pathlib import Path

        path = Path(self.run_dir) / "curve.json" if self.run_dir else None
        if path is not None and path.is_file():
            self.curve = [e for e in json.loads(path.read_text())["curve"]
                          if e["step"] <= self.start_step]
        if not any(e["step"] == 0 for e in self.curve):
            self.curve.insert(0, {"step": 0, "report": self.gold_report(adapter=False)})
        self._log_gold(self.curve[0])

    def _log_gold(self, e: dict) -> None:
        if self.rank == 0:
            cells = ", ".join(f"{f} acc {100 * r['decision_accuracy']:.1f} recall "
                              f"{100 * r['gold_recall']:.1f}" for f, r in e["report"].items())
            print(f"step {e['step']} gold validation: {cells}", flush=True)

    def validate_gold(self) -> dict:
        """Score this step, extend the curve, keep the best checkpoint (rank 0 writes
        ``best/`` and ``curve.json``/``curve.png`` in the run directory) and decide early
        stopping; returns the metrics to report."""
        from canopy_ray.train.validation import best_entry, since_best

        entry = {"step": self.state.step, "train_s": round(self.state.train_s, 1),
                 "report": self.gold_report()}
        self.curve = [e for e in self.curve if e["step"] != entry["step"]] + [entry]
        self._log_gold(entry)
        best = best_entry(self.curve, self.tolerance)
        if self.rank == 0 and self.run_dir:
            self._write_curve(best, best["step"] == entry["step"])
        if self.patience and since_best(self.curve, self.tolerance) >= self.patience:
            self.stopped = True
        return {"val_gold": entry["report"], "best_step": best["step"],
                "best_qualifies": best["qualifies"], "stopped_early": self.stopped}

    def _write_curve(self, best: dict, new_best: bool) -> None:
        import shutil
        from pathlib import Path

        from canopy_ray.core.files import write_json
        from canopy_ray.train.lora import save_adapter
        from canopy_ray.train.validation import plot_curve

        run_dir = Path(self.run_dir)
        if new_best:  # written beside, then swapped in: a kill never leaves half a best/
            tmp, dst = run_dir / "best.tmp", run_dir / "best"
            shutil.rmtree(tmp, ignore_errors=True)
            save_adapter(self.model, tmp)
            write_json(tmp / "best.json", {k: best[k] for k in ("step", "qualifies", "fallback",
                                                                "report")})
            shutil.rmtree(dst, ignore_errors=True)
            tmp.rename(dst)
        write_json(run_dir / "curve.json", {"curve": self.curve, "best_step": best["step"],
                                            "qualifies": best["qualifies"],
                                            "tolerance": self.tolerance})
        plot_curve(self.curve, run_dir / "curve.png", f"{run_dir.name}: validation")

    def report(self, final: bool = False) -> None:
        """Report the metrics since the last report, with a checkpoint written by rank 0."""
        import ray.train

        from canopy_ray.train.lora import save_checkpoint

        metrics = {"step": self.state.step, "epoch": self.state.step / max(self.per_epoch, 1),
                   "loss": float(np.mean(self.losses)) if self.losses else self.last_loss,
                   "train_s": self.state.train_s, "total_steps": self.total,
                   "instances": self.n, "start_step": self.start_step, "final": final}
        acc = self.validate()
        if acc is not None:
            metrics["val_decision_accuracy"] = acc
            if self.rank == 0:
                print(f"step {self.state.step}: validation decision accuracy {acc:.4f}", flush=True)
        if self.gold_val:  # a step already scored (early stop, then the final report) is not redone
            if not (self.gold_metrics and self.curve[-1]["step"] == self.state.step):
                self.gold_metrics = self.validate_gold()
            metrics.update(self.gold_metrics)
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if self.rank == 0:
                save_checkpoint(self.model, self.optimizer, self.state, d)
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=checkpoint)
        if self.losses:  # an early stop's final report (no step since) repeats the last loss
            self.last_loss = float(np.mean(self.losses))
        self.losses = []


def _part_arrays(part: dict):
    """``(states, offsets, queries)`` of a loop part: memory-mapped bottom states, their row
    offsets (None, None for a part of node texts, :mod:`canopy_ray.train.qwen`) and the f0
    query vectors as a tensor."""
    queries = torch.from_numpy(np.asarray(part["queries"], dtype=np.float32))
    if "bottom" not in part:
        return None, None, queries
    sp, op = part["bottom"]
    return np.load(sp, mmap_mode="r"), np.load(op), queries
