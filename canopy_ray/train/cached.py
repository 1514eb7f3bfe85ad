"""Training through the top layers only: frozen bottom-layer states computed once.

With LoRA on the top ``L`` transformer layers only, everything below them (embeddings and
the bottom ``N - L`` layers) is frozen and deterministic (run in eval mode, no dropout).
So each distinct node text's hidden states after the bottom layers are computed ONCE,
without gradients and in length-sorted batches (:func:`bottom_states`), and kept as one
flat float32 array of all tokens plus row offsets (a ``.npy`` pair in the run directory).
A training step then runs only the top layers with LoRA on the cached states and mean
pools (:class:`TopEncoder`): about ``L / N`` of the forward and backward cost, and no
tokenisation.

The result equals the full PEFT model's output for the same adapter weights (up to float
rounding; ``tests/train/test_cached.py``), because a BERT token's state after layer k
depends only on the unpadded tokens of its own text (padding is masked out as keys), and
mean pooling ignores padded positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from canopy_ray.core.files import atomic_path, digest


def bert_of(model):
    """The underlying BertModel of a PEFT model (LoRA layers injected in place) or itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _mask(bert, hidden: torch.Tensor, mask: torch.Tensor):
    """The attention mask the layers take (per the model's attention implementation), as BERT's
    forward builds it; transformers' public helper, since BertModel's own changes between releases."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=bert.config, inputs_embeds=hidden, attention_mask=mask)


@torch.inference_mode()
def bottom_states(model, tokenizer, texts: Sequence[str], n_bottom: int, max_length: int,
                  batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``(states, offsets)``: the hidden states after the embeddings and the first
    ``n_bottom`` layers for each text's tokens (truncated at ``max_length``), text i's rows
    being ``states[offsets[i]:offsets[i + 1]]``. The model runs in eval mode."""
    bert = bert_of(model)
    was_training = bert.training
    bert.eval()
    lengths = [len(ids) for ids in tokenizer(list(texts), truncation=True,
                                             max_length=max_length)["input_ids"]]
    offsets = np.zeros(len(texts) + 1, np.int64)
    offsets[1:] = np.cumsum(lengths)
    states = np.zeros((int(offsets[-1]), int(bert.config.hidden_size)), np.float32)
    order = np.argsort(lengths, kind="stable")
    for i in range(0, len(order), batch_size):
        rows = order[i:i + batch_size]
        batch = tokenizer([texts[r] for r in rows], padding=True, truncation=True,
                          max_length=max_length, return_tensors="pt")
        h = bert.embeddings(input_ids=batch["input_ids"])
        ext = _mask(bert, h, batch["attention_mask"])
        for layer in bert.encoder.layer[:n_bottom]:
            h = layer(h, ext)
        h = h.float().numpy()
        for j, r in enumerate(rows):
            states[offsets[r]:offsets[r + 1]] = h[j, :lengths[r]]
    bert.train(was_training)
    return states, offsets


class TopEncoder(torch.nn.Module):
    """The top layers (with their LoRA) + mean pooling over cached bottom states.

    ``forward(hidden, mask)`` takes padded bottom states (n, t, d) and the attention mask
    (n, t) and returns unit vectors (n, d). Wrapping this module (not the PEFT model) in
    DDP keeps the gradient hooks on the path that is actually run.
    """

    def __init__(self, peft_model, n_bottom: int):
        super().__init__()
        self.model = peft_model
        self.n_bottom = n_bottom

    def forward(self, hidden, mask) -> torch.Tensor:
        """One padded batch, or lists of them (length-sorted chunks run in ONE call, so DDP
        sees one forward per backward); the outputs are concatenated in chunk order."""
        if isinstance(hidden, (list, tuple)):
            return torch.cat([self._top(h, m) for h, m in zip(hidden, mask)])
        return self._top(hidden, mask)

    def _top(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        from canopy_ray.models.encoder import mean_pool

        bert = bert_of(self.model)
        ext = _mask(bert, hidden, mask)
        for layer in bert.encoder.layer[self.n_bottom:]:
            hidden = layer(hidden, ext)
        return mean_pool(hidden, mask)


def gather(states: np.ndarray, offsets: np.ndarray, rows: Sequence[int]):
    """Padded ``(hidden, mask)`` tensors of the given text rows."""
    lens = [int(offsets[r + 1] - offsets[r]) for r in rows]
    t = max(lens)
    hidden = torch.zeros(len(rows), t, states.shape[1], dtype=torch.float32)
    mask = torch.zeros(len(rows), t, dtype=torch.long)
    for j, r in enumerate(rows):
        hidden[j, :lens[j]] = torch.from_numpy(np.asarray(states[offsets[r]:offsets[r + 1]],
                                                          dtype=np.float32))
        mask[j, :lens[j]] = 1
    return hidden, mask


def encode_rows(top: torch.nn.Module, states, offsets, rows: Sequence[int],
                batch_size: int = 0) -> torch.Tensor:
    """Unit vectors of text rows through ``top`` (in length-sorted chunks of ``batch_size``
    rows when > 0), in the order of ``rows``, with gradients unless the caller turns them off.

    Chunks matter in training too: ~8% of node texts reach the 128-token cap, so one padded
    batch of a step's ~48 texts is nearly always 128 wide; chunks of 16 made a step 2.3x
    faster (measured on the shared cache, forward + backward, best of 4)."""
    if not batch_size or len(rows) <= batch_size:
        return top(*gather(states, offsets, rows))
    order = sorted(range(len(rows)), key=lambda k: offsets[rows[k] + 1] - offsets[rows[k]])
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    hidden, mask = zip(*(gather(states, offsets, [rows[k] for k in c]) for c in chunks))
    vecs = top(list(hidden), list(mask))
    where = torch.empty(len(rows), dtype=torch.long)
    where[torch.tensor(order)] = torch.arange(len(rows))
    return vecs[where]


def cache_bottom(model, tokenizer, texts: Sequence[str], n_bottom: int, max_length: int,
                 cache_dir: str | Path, tag: str = "", batch_size: int = 64) -> tuple[Path, Path]:
    """Compute (or reuse) the bottom states of ``texts`` as ``.npy`` files in ``cache_dir``,
    keyed by a hash of ``tag`` (the encoder), ``n_bottom``, ``max_length`` and the texts.
    Returns ``(states_path, offsets_path)``; load them with ``np.load(..., mmap_mode="r")``.

    Each file is written atomically, the offsets first: a states file means both are complete.
    """
    key = digest([tag, n_bottom, max_length, list(texts)])
    d = Path(cache_dir)
    sp, op = d / f"bottom-{key}-states.npy", d / f"bottom-{key}-offsets.npy"
    if sp.is_file() and op.is_file():
        return sp, op
    states, offsets = bottom_states(model, tokenizer, texts, n_bottom, max_length, batch_size)
    for path, arr in ((op, offsets), (sp, states)):
        with atomic_path(path) as tmp:
            np.save(tmp, arr)
    return sp, op


def decision_accuracy(vecs: torch.Tensor, queries: torch.Tensor, instances) -> float:
    """Share of instances ``(query_row, node_rows, pairs)`` whose pairs all hold, with
    ``vecs`` indexed by node row (the refinement's decision accuracy, CANOPY 3)."""
    right = 0
    for qi, rows, pairs in instances:
        s = vecs[list(rows)] @ queries[qi]
        right += all(bool(s[p[0]] > s[p[1]]) for p in pairs)
    return right / max(len(instances), 1)
