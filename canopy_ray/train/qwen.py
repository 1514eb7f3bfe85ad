"""Training f_theta on Qwen3-VL-Embedding (the paper's encoder; ``models.encoder: qwen3-vl``).

The same loop, loss, schedule, checkpoints and recall-aware validation as the MiniLM path
(:mod:`canopy_ray.train.loop`), with what the 2B model needs instead of cached states:

- LoRA on every linear map of the language model's layers (``LANGUAGE_TARGETS``); the
  vision tower and everything else stay frozen (no LoRA, ``requires_grad`` off);
- the full model runs each step, bf16 on a GPU and fp32 on CPU (the adapter weights are kept
  in fp32 by PEFT, so AdamW updates them at full precision), with gradient checkpointing
  (non-reentrant, the form DDP and frozen inputs allow);
- node inputs are built exactly as at inference (:class:`Qwen3VLEncoder`'s conversation
  template for documents, truncated at ``training.max_length``) and pooled on the last token;
- several workers with ``ScalingConfig(use_gpu=training.use_gpu)``: each worker has its
  device (``ray.train.torch.get_device``) and DDP averages the adapter's gradients.

The saved adapter is a standard PEFT adapter of ``Qwen3VLModel``, which
``Qwen3VLEncoder(model_dir, adapter=...)`` loads for inference (nodes only; queries stay f0).
"""

from __future__ import annotations

from typing import Sequence

import torch

from canopy_ray.train.loop import Worker, eval_mode_except_lora_dropout

# q/k/v/o and the MLP of every language-model layer; ``visual.`` never matches
LANGUAGE_TARGETS = r".*language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"


def qwen_lora(base, rank: int = 8, alpha: int = 16, dropout: float = 0.05):
    """``base`` (a ``Qwen3VLModel``) with every weight frozen and a fresh LoRA (B = 0, so it
    starts equal to f0) on the language model only."""
    from peft import LoraConfig, get_peft_model

    for p in base.parameters():
        p.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                        target_modules=LANGUAGE_TARGETS, bias="none")
    return get_peft_model(base, config)


def enable_checkpointing(base) -> None:
    """Non-reentrant activation (gradient) checkpointing, by the name this transformers has."""
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class LastTokenNodes(torch.nn.Module):
    """Node texts -> unit vectors with gradients: the inference input template, the model
    with its LoRA, last-token pooling (what DDP wraps)."""

    def __init__(self, encoder, peft_model, max_length: int):
        super().__init__()
        self.encoder = encoder  # builds the inputs (tokenizer, template); not a parameter holder
        self.model = peft_model
        self.max_length = max_length

    def inputs(self, texts: Sequence[str]):
        enc = self.encoder
        rows = []
        for t in texts:
            ids = enc._sample(enc.doc_instruction, t, [], [])["ids"]
            rows.append(ids if len(ids) <= self.max_length else
                        _truncate(ids, self.max_length, enc.special_ids))
        n = max(len(r) for r in rows)
        ids = torch.full((len(rows), n), enc.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
        return ids, mask

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        self.encoder.base.rope_deltas = None  # positions recomputed per batch, as at inference
        out = self.model(input_ids=ids, attention_mask=mask,
                         mm_token_type_ids=torch.zeros_like(ids, dtype=torch.int32), use_cache=False)
        hidden = out.last_hidden_state
        last = mask.sum(1) - 1
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float()
        return torch.nn.functional.normalize(pooled, dim=-1)


def _truncate(ids, max_length, special):
    from canopy_ray.models.qwen3vl import truncate_keep_special

    return truncate_keep_special(ids, max_length, special)


class QwenWorker(Worker):
    """The Ray Train worker for Qwen3-VL: full forward per step (no cached states)."""

    def _setup_model(self, t: dict, encoder_path) -> None:
        import ray.train
        import ray.train.torch

        from canopy_ray.models.qwen3vl import Qwen3VLEncoder
        from canopy_ray.train.lora import TrainState, load_checkpoint

        torch.manual_seed(t["seed"])
        device = ray.train.torch.get_device()
        dev = str(device) if device.type == "cuda" else "cpu"
        self.encoder = Qwen3VLEncoder(encoder_path, None, device=dev)  # bf16 on GPU, fp32 on CPU
        base = self.encoder.base
        enable_checkpointing(base)
        self.model = qwen_lora(base, t["lora_rank"], t["lora_alpha"], t["lora_dropout"]).to(dev)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                           lr=t["lr"])
        self.state = TrainState()
        ckpt = self.checkpoint()  # Ray's newest, else the trainer's pick past a torn record
        if ckpt is not None:
            with ckpt.as_directory() as d:
                self.state = load_checkpoint(self.model, self.optimizer, d)
        self.start_step = self.state.step
        self.nodes = LastTokenNodes(self.encoder, self.model, int(t["max_length"]))
        self.top = ray.train.torch.prepare_model(self.nodes, move_to_device=False)
        eval_mode_except_lora_dropout(self.model)

    def _texts(self, part: dict, rows: Sequence[int]) -> list[str]:
        return [part["texts"][r] for r in rows]

    def batch_loss(self, rows: list[int]) -> torch.Tensor:
        from canopy_ray.train.loss import batch_loss

        nodes: dict[int, int] = {}
        q_rows: dict[int, int] = {}
        groups = []
        for r in rows:
            qi, node_rows, pairs = self.instances[r]
            q_rows.setdefault(qi, len(q_rows))
            groups.append((q_rows[qi], [nodes.setdefault(n, len(nodes)) for n in node_rows], pairs))
        vecs = self.top(*self.nodes.inputs(self._texts(self.train_part, list(nodes))))
        queries = self.queries[list(q_rows)].to(vecs.device)
        return batch_loss(queries, vecs, groups, self.lam)

    def encode_part(self, part: dict, states, offsets) -> torch.Tensor:
        texts = part["texts"]
        out = []
        for i in range(0, len(texts), 16):
            out.append(self.top(*self.nodes.inputs(texts[i:i + 16])).cpu())
        return torch.cat(out)

    def __init__(self, config: dict):
        self.train_part = config
        super().__init__(config)
