"""The Ray Train loop: LoRA on the node encoder against frozen f0 query vectors.

``train_loop(config)`` runs on every Ray Train worker. ``config`` (built by
:func:`canopy_ray.trainer.train`) carries the training section, the encoder directory,
the f0 query vectors (computed once, without gradients, before training) and the
instances as plain tuples ``(query_row, texts, pairs)``.

Data parallelism: each epoch the instances are shuffled with ``seed + epoch``; a global
batch of ``batch_size`` instances is dealt round-robin over the workers and DDP averages
their gradients, so the optimisation does not depend on the number of workers. Every
``checkpoint_every`` steps (and at the end) rank 0 writes a checkpoint (adapter +
optimizer + step) and all workers report. On a restart with the same storage path and
run name, ``ray.train.get_checkpoint()`` returns the latest checkpoint and the loop
continues from its step, skipping the batches of the epoch already done.
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Sequence

import numpy as np
import torch


def step_batches(n: int, batch_size: int, epoch: int, seed: int, world: int) -> list[np.ndarray]:
    """The global batches of one epoch (index arrays); a tail smaller than ``world`` is dropped."""
    order = np.random.default_rng(seed + epoch).permutation(n)
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    return [b for b in batches if len(b) >= world]


def encode(model, tokenizer, texts: Sequence[str], max_length: int) -> torch.Tensor:
    """Mean-pooled unit vectors with gradients."""
    from canopy_ray.models.encoder import mean_pool

    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt")
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return mean_pool(out.last_hidden_state, batch["attention_mask"])


def local_loss(model, tokenizer, queries: torch.Tensor, instances, rows: Sequence[int],
               lam: float, max_length: int) -> torch.Tensor:
    """Mean loss of the given instances; each distinct node text is encoded once."""
    from canopy_ray.train.loss import batch_loss

    texts: dict[str, int] = {}
    q_rows: dict[int, int] = {}
    groups = []
    for r in rows:
        qi, node_texts, pairs = instances[r]
        q_rows.setdefault(qi, len(q_rows))
        node_rows = [texts.setdefault(t, len(texts)) for t in node_texts]
        groups.append((q_rows[qi], node_rows, pairs))
    node_vecs = encode(model, tokenizer, list(texts), max_length)
    q = queries[list(q_rows)]
    return batch_loss(q, node_vecs, groups, lam)


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
    node_vecs = encode_rows(top, states, offsets, list(nodes))
    return batch_loss(queries[list(q_rows)], node_vecs, groups, lam)


def _load_bottom(paths):
    sp, op = paths
    return np.load(sp, mmap_mode="r"), np.load(op)


def _eval_mode_except_lora_dropout(model) -> None:
    """Train mode for the LoRA dropout only: the base model's own dropout stays off, as in
    the cached bottom layers (frozen, deterministic)."""
    model.train()
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout) and "lora_dropout" not in name:
            m.eval()


def train_loop(config: dict) -> None:
    """One Ray Train worker: LoRA on the top ``lora_layers`` layers, trained on cached
    bottom-layer states (:mod:`canopy_ray.train.cached`)."""
    import ray.train
    import ray.train.torch

    from canopy_ray.train.cached import TopEncoder, decision_accuracy, encode_rows
    from canopy_ray.train.lora import (TrainState, load_base, load_checkpoint, lora_model,
                                       n_layers, save_checkpoint)

    t = config["training"]
    torch.set_num_threads(int(t.get("threads") or 1))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(t["seed"])
    _, base = load_base(config.get("encoder_path"))
    total_layers = n_layers(base)
    top_layers = t.get("lora_layers") or total_layers
    n_bottom = total_layers - min(top_layers, total_layers)
    model = lora_model(base, t["lora_rank"], t["lora_alpha"], t["lora_dropout"], top_layers)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=t["lr"])
    state = TrainState()
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = load_checkpoint(model, optimizer, d)
    start_step = state.step
    peft_model = model
    top = ray.train.torch.prepare_model(TopEncoder(model, n_bottom))
    _eval_mode_except_lora_dropout(peft_model)

    states, offsets = _load_bottom(config["bottom"])
    queries = torch.from_numpy(np.asarray(config["queries"], dtype=np.float32))
    instances = config["instances"]
    val = config.get("val")
    if val:
        v_states, v_offsets = _load_bottom(val["bottom"])
        v_queries = torch.from_numpy(np.asarray(val["queries"], dtype=np.float32))
    n, bs, lam = len(instances), t["batch_size"], t["temperature"]
    per_epoch = len(step_batches(n, bs, 0, t["seed"], world))
    total = per_epoch * t["epochs"]
    if config.get("max_steps"):
        total = min(total, int(config["max_steps"]))
    budget = config.get("time_budget_s")
    every = int(config.get("checkpoint_every") or per_epoch)

    def val_accuracy() -> float | None:
        if not val:
            return None
        peft_model.eval()
        with torch.no_grad():
            vecs = encode_rows(top, v_states, v_offsets, list(range(len(v_offsets) - 1)), 64)
        _eval_mode_except_lora_dropout(peft_model)
        return decision_accuracy(vecs, v_queries, val["instances"])

    def report(losses: list[float], final: bool = False) -> None:
        metrics = {"step": state.step, "epoch": state.step / max(per_epoch, 1),
                   "loss": float(np.mean(losses)) if losses else float("nan"),
                   "train_s": state.train_s, "total_steps": total, "instances": n,
                   "start_step": start_step, "final": final}
        acc = val_accuracy()
        if acc is not None:
            metrics["val_decision_accuracy"] = acc
            if rank == 0:
                print(f"step {state.step}: validation decision accuracy {acc:.4f}", flush=True)
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if rank == 0:
                save_checkpoint(peft_model, optimizer, state, d)
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=checkpoint)

    if val and start_step == 0 and rank == 0:
        print(f"step 0 (f0): validation decision accuracy {val_accuracy():.4f}", flush=True)
    losses: list[float] = []
    epoch = state.step // per_epoch if per_epoch else 0
    out_of_time = False
    while state.step < total and not out_of_time:
        batches = step_batches(n, bs, epoch, t["seed"], world)
        for b in batches[state.step - epoch * per_epoch:]:
            if state.step >= total:
                break
            t0 = time.perf_counter()
            loss = cached_loss(top, states, offsets, queries, instances, b[rank::world].tolist(), lam)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            state.step += 1
            state.train_s += time.perf_counter() - t0
            losses.append(float(loss.detach()))
            if rank == 0 and state.step % 10 == 0:
                print(f"step {state.step}/{total} loss {np.mean(losses[-10:]):.4f} "
                      f"{state.train_s / max(state.step - start_step, 1):.2f} s/step", flush=True)
            if budget:
                flag = torch.tensor([float(state.train_s >= budget)])
                if world > 1:  # all workers stop at the same step
                    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
                if flag.item() > 0:
                    out_of_time = True
                    break
            if state.step % every == 0 and state.step < total:
                report(losses)
                losses = []
        epoch += 1
    report(losses, final=True)


def steps_for(n_instances: int, batch_size: int, epochs: int, world: int = 1) -> int:
    return math.ceil(n_instances / batch_size) * epochs if world == 1 else \
        len(step_batches(n_instances, batch_size, 0, 0, world)) * epochs
