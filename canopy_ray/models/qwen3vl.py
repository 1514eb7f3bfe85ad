"""Qwen3-VL-Embedding (the paper's encoder; the GPU configuration) behind the Encoder interface.

Inputs follow the published Qwen3-VL-Embedding usage (``Qwen3VLEmbedder`` of the model's
repository): a system turn with an instruction (``DOC_INSTRUCTION`` for items and nodes,
``QUERY_INSTRUCTION`` for queries; a final punctuation mark is added when missing), a user turn
holding the video, then the image, then the text ("NULL" only when all three are missing), and
the assistant prompt. A sequence longer than ``max_length`` is truncated whole, keeping every
special token (so image and video placeholders always match their pixels). The embedding is
the final hidden state of the last token (last-token pooling), L2-normalised.

- Images are resized once, by Qwen-VL's rule (sides multiples of 32, area within
  ``MIN_PIXELS`` .. ``MAX_PIXELS`` = 4*32^2 .. 1800*32^2), then given to the checkpoint's own
  image processor with its resize off (any backend; the PIL one needs no torchvision).
- Video nodes are embedded from their frames: decoded with ``decord`` at the node's frame
  times (one per 10 s, at most 32), patchified in the Qwen3-VL video layout (pairs of frames
  form one temporal patch), each pair preceded by its ``<t seconds>`` timestamp, as the
  Qwen3-VL processor writes them. This path needs no torchvision either.
- f_theta is the same model with a PEFT LoRA adapter; queries and items (f0) run with the
  adapter disabled. Without an adapter f_theta equals f0.

Nothing is downloaded: ``model_dir`` must be a local copy of ``Qwen/Qwen3-VL-Embedding-2B``, whose
weights sit under the embedding wrapper's ``model.`` prefix (``model.language_model...``,
``model.visual...``); a checkpoint whose weights do not all load is an error, never a silently
random model. ``build_tiny_qwen3vl`` writes a randomly initialised miniature in that layout, used
by the tests and for smoke runs.
"""

from __future__ import annotations

import contextlib
import math
import unicodedata
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from canopy_ray.core.evidence import Piece
from canopy_ray.models.adapters import adapter_id
from canopy_ray.models.batching import length_batches

DOC_INSTRUCTION = "Represent the user's input."
QUERY_INSTRUCTION = "Retrieve text, tables, images or video segments that help answer the question."

IMAGE_FACTOR = 32  # patch 16 x spatial merge 2
MIN_PIXELS = 4 * IMAGE_FACTOR * IMAGE_FACTOR  # the published embedder's image bounds
MAX_PIXELS = 1800 * IMAGE_FACTOR * IMAGE_FACTOR

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's resize rule: both sides multiples of ``factor``, area within the bounds."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def punctuated(instruction: str) -> str:
    """The instruction ending in punctuation, as the published embedder writes it."""
    instruction = instruction.strip()
    if instruction and not unicodedata.category(instruction[-1]).startswith("P"):
        instruction += "."
    return instruction


def truncate_keep_special(ids: Sequence[int], max_length: int, special: set[int]) -> list[int]:
    """At most ``max_length`` ids: every special id kept, and the first non-special ids that fit
    with them (the published embedder's rule; the chat template's closing text goes first)."""
    if len(ids) <= max_length:
        return list(ids)
    keep = max(0, max_length - sum(1 for i in ids if i in special))
    out = []
    for i in ids:
        if i in special:
            out.append(i)
        elif keep > 0:
            out.append(i)
            keep -= 1
    return out


def read_frames(path: str, times: Sequence[float]) -> np.ndarray:
    """RGB frames (T, H, W, 3) uint8 at the given times (seconds), decoded with decord."""
    from canopy_ray.models.media import decord_frames

    return decord_frames(path, times)


def load_image(path: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


class Qwen3VLEncoder:
    """Qwen3-VL-Embedding as f0 (queries, items) and f_theta (nodes, with LoRA)."""

    def __init__(self, model_dir: str | Path | None, adapter: str | Path | None = None, *,
                 max_length: int = 8192, batch_size: int = 8, batch_tokens: int | None = None,
                 device: str = "cuda",
                 dtype: torch.dtype | None = None, min_image_pixels: int = MIN_PIXELS,
                 max_image_pixels: int = MAX_PIXELS, max_frame_pixels: int = 256 * 32 * 32,
                 query_instruction: str = QUERY_INSTRUCTION, doc_instruction: str = DOC_INSTRUCTION):
        from transformers import AutoTokenizer, Qwen3VLModel

        if not model_dir:
            raise ValueError("the qwen3-vl encoder needs models.encoder_path: a local directory "
                             "holding Qwen/Qwen3-VL-Embedding-2B (nothing is downloaded)")
        model_dir = Path(model_dir)
        if device.startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"
        dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.image_processor = _load_image_processor(model_dir)
        model, info = Qwen3VLModel.from_pretrained(model_dir, dtype=dtype, local_files_only=True,
                                                   output_loading_info=True)
        if info.get("missing_keys") or info.get("mismatched_keys"):  # else it would run half random
            raise ValueError(f"{model_dir} is not a Qwen3-VL(-Embedding) checkpoint: missing "
                             f"{sorted(info.get('missing_keys') or [])[:5]}, mismatched "
                             f"{[k for k, *_ in info.get('mismatched_keys') or []][:5]}")
        self.base = model
        self.model_id = model_dir.name
        self.adapter_id = adapter_id(adapter)
        self.has_adapter = bool(adapter)
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        self.model = model.to(device).eval()
        cfg = self.base.config
        self.dim = int(cfg.text_config.hidden_size)
        self.image_token_id, self.video_token_id = cfg.image_token_id, cfg.video_token_id
        self.vision_start_id, self.vision_end_id = cfg.vision_start_token_id, cfg.vision_end_token_id
        # never truncated: chat markers, and image/video placeholders (they must match the pixels)
        self.special_ids = set(self.tokenizer.all_special_ids) | {
            self.image_token_id, self.video_token_id, self.vision_start_id, self.vision_end_id}
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.convert_tokens_to_ids("<|endoftext|>")
        ip = self.image_processor
        self.patch_size = int(getattr(ip, "patch_size", cfg.vision_config.patch_size))
        self.merge_size = int(getattr(ip, "merge_size", cfg.vision_config.spatial_merge_size))
        self.temporal_patch_size = int(getattr(ip, "temporal_patch_size", cfg.vision_config.temporal_patch_size))
        self.mean = np.asarray(getattr(ip, "image_mean", None) or [0.5] * 3, np.float32)
        self.std = np.asarray(getattr(ip, "image_std", None) or [0.5] * 3, np.float32)
        self.max_length, self.batch_size, self.device = max_length, batch_size, device
        self.batch_tokens = batch_tokens
        self.min_image_pixels, self.max_image_pixels = min_image_pixels, max_image_pixels
        self.max_frame_pixels = max_frame_pixels
        self.query_instruction, self.doc_instruction = punctuated(query_instruction), punctuated(doc_instruction)

    # ---- input building -------------------------------------------------------------------
    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def resized_image(self, image: np.ndarray) -> np.ndarray:
        """The one resize an image gets: sides multiples of 32, area within the pixel bounds."""
        from PIL import Image

        h, w = image.shape[:2]
        factor = self.patch_size * self.merge_size
        rh, rw = smart_resize(h, w, factor, self.min_image_pixels, self.max_image_pixels)
        if (rh, rw) != (h, w):
            image = np.asarray(Image.fromarray(image).resize((rw, rh), Image.BICUBIC))
        return image

    def _image_input(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = self.image_processor(images=[self.resized_image(image)], do_resize=False, return_tensors="np")
        return np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_grid_thw"])[0]

    def frames_input(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Frames (T, H, W, 3) uint8 -> (patches, grid_thw) in the Qwen3-VL video layout."""
        from PIL import Image

        ps, m, tps = self.patch_size, self.merge_size, self.temporal_patch_size
        t, h0, w0 = frames.shape[:3]
        h, w = smart_resize(h0, w0, ps * m, (ps * m) ** 2, self.max_frame_pixels)
        x = np.stack([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC)) for f in frames])
        x = (x.astype(np.float32) / 255.0 - self.mean) / self.std
        x = x.transpose(0, 3, 1, 2)  # T, C, H, W
        if t % tps:
            x = np.concatenate([x, np.repeat(x[-1:], tps - t % tps, axis=0)])
        gt, gh, gw = x.shape[0] // tps, h // ps, w // ps
        x = x.reshape(gt, tps, 3, gh // m, m, ps, gw // m, m, ps).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return np.ascontiguousarray(x.reshape(gt * gh * gw, 3 * tps * ps * ps)), np.array([gt, gh, gw])

    def _sample(self, instruction: str, text: str, images: list[np.ndarray],
                videos: list[tuple[np.ndarray, list[float]]]) -> dict:
        """Token ids of one conversation plus its pixel inputs: video, image, text (the published
        order), the whole sequence truncated to ``max_length`` keeping the special tokens."""
        ids = self._ids(f"<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n")
        img_px, img_grid, vid_px, vid_grid = [], [], [], []
        m2 = self.merge_size ** 2
        for frames, times in videos:
            px, grid = self.frames_input(frames)
            vid_px.append(px)
            vid_grid.append(grid)
            per_frame = int(grid[1] * grid[2] // m2)
            tps = self.temporal_patch_size
            padded = list(times) + [times[-1]] * (-len(times) % tps)
            for g in range(int(grid[0])):
                stamp = sum(padded[g * tps:(g + 1) * tps]) / tps
                ids += self._ids(f"<{stamp:.1f} seconds>")
                ids += [self.vision_start_id] + [self.video_token_id] * per_frame + [self.vision_end_id]
        for image in images:
            px, grid = self._image_input(image)
            img_px.append(px)
            img_grid.append(grid)
            ids += [self.vision_start_id] + [self.image_token_id] * int(grid.prod() // m2) + [self.vision_end_id]
        if text or not (images or videos):
            ids += self._ids(text or "NULL")
        ids += self._ids("<|im_end|>\n<|im_start|>assistant\n")
        ids = truncate_keep_special(ids, self.max_length, self.special_ids)
        return {"ids": ids, "img_px": img_px, "img_grid": img_grid, "vid_px": vid_px, "vid_grid": vid_grid}

    def _piece_sample(self, piece: Piece, instruction: str) -> dict:
        images, videos = [], OrderedDict()
        for path, t in piece.media:
            if t is None:
                images.append(load_image(path))
            else:
                videos.setdefault(path, []).append(float(t))
        vids = [(read_frames(p, ts), ts) for p, ts in videos.items()]
        return self._sample(instruction, piece.text, images, vids)

    # ---- forward --------------------------------------------------------------------------
    @torch.inference_mode()
    def _forward(self, samples: list[dict]) -> np.ndarray:
        n = max(len(s["ids"]) for s in samples)
        ids = torch.full((len(samples), n), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(samples), n), dtype=torch.long)
        for i, s in enumerate(samples):  # right padding; the last real token is pooled
            ids[i, : len(s["ids"])] = torch.tensor(s["ids"])
            mask[i, : len(s["ids"])] = 1
        mm_types = torch.zeros_like(ids, dtype=torch.int32)
        mm_types[ids == self.image_token_id] = 1
        mm_types[ids == self.video_token_id] = 2
        kwargs = {}
        dtype = self.base.dtype
        img = [p for s in samples for p in s["img_px"]]
        if img:
            kwargs["pixel_values"] = torch.from_numpy(np.concatenate(img)).to(self.device, dtype)
            kwargs["image_grid_thw"] = torch.tensor(np.stack([g for s in samples for g in s["img_grid"]]),
                                                    device=self.device)
        vid = [p for s in samples for p in s["vid_px"]]
        if vid:
            kwargs["pixel_values_videos"] = torch.from_numpy(np.concatenate(vid)).to(self.device, dtype)
            kwargs["video_grid_thw"] = torch.tensor(np.stack([g for s in samples for g in s["vid_grid"]]),
                                                    device=self.device)
        self.base.rope_deltas = None  # no generation cache: positions are recomputed per batch
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                         mm_token_type_ids=mm_types.to(self.device), use_cache=False, **kwargs)
        hidden = out.last_hidden_state
        last = mask.sum(1).to(hidden.device) - 1
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float()
        return torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()

    def _encode(self, samples_fn, inputs: Sequence, use_adapter: bool, has_media=lambda x: False) -> np.ndarray:
        """Text-only inputs are tokenized up front and batched by length (little padding);
        inputs with media are built batch by batch in the given order (their pixels are large).
        Vectors come back in the order of ``inputs``."""
        if not inputs:
            return np.zeros((0, self.dim), np.float32)
        media = [i for i, x in enumerate(inputs) if has_media(x)]
        text = {i: samples_fn(x) for i, x in enumerate(inputs) if not has_media(x)}
        keys = list(text)
        batches = [[keys[j] for j in b] for b in length_batches([len(text[i]["ids"]) for i in keys],
                                                                 self.batch_size, self.batch_tokens)]
        batches += [media[i:i + self.batch_size] for i in range(0, len(media), self.batch_size)]
        ctx = (self.model.disable_adapter() if self.has_adapter and not use_adapter
               else contextlib.nullcontext())
        out = np.empty((len(inputs), self.dim), np.float32)
        with ctx:
            for batch in batches:
                out[batch] = self._forward([text[i] if i in text else samples_fn(inputs[i]) for i in batch])
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(lambda t: self._sample(self.query_instruction, t, [], []), list(texts), False)

    def encode_items(self, items: Sequence[Piece]) -> np.ndarray:
        return self._encode(lambda p: self._piece_sample(p, self.doc_instruction), list(items), False,
                            lambda p: bool(p.media))

    def encode_nodes(self, nodes: Sequence[Piece]) -> np.ndarray:
        return self._encode(lambda p: self._piece_sample(p, self.doc_instruction), list(nodes), True,
                            lambda p: bool(p.media))

    def token_counts(self, pieces: Sequence[Piece]) -> list[int]:
        """Text tokens each piece is encoded with: the instruction template and the truncated
        text. The visual tokens of images and frames (which depend on their decoded sizes) are
        not counted."""
        return [len(self._sample(self.doc_instruction, p.text, [], [])["ids"]) for p in pieces]

    def encode_frames(self, frames: np.ndarray, times: Sequence[float], text: str = "",
                      use_adapter: bool = True) -> np.ndarray:
        """One embedding of already decoded frames (T, H, W, 3) with their times."""
        return self._encode(lambda _: self._sample(self.doc_instruction, text, [], [(frames, list(times))]),
                            [0], use_adapter)[0]


def _load_image_processor(model_dir: Path):
    try:
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(model_dir, local_files_only=True)
    except Exception:  # no torchvision for the fast backend: the PIL one reads the same config
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        return Qwen2VLImageProcessorPil.from_pretrained(model_dir, local_files_only=True)


def build_tiny_qwen3vl(out_dir: str | Path, seed: int = 0, hidden: int = 64, layout: str = "embedding") -> Path:
    """Write a randomly initialised miniature Qwen3-VL (byte-level tokenizer, 2+2 layers).

    The directory has the layout of the real checkpoint (config, weights, tokenizer, image
    processor), so ``Qwen3VLEncoder(out_dir)`` exercises the real loading path offline.
    ``layout="embedding"`` stores the weights as Qwen3-VL-Embedding does, under the embedding
    wrapper's ``model.`` prefix (``architectures: ["Qwen3VLForEmbedding"]``); ``"plain"`` as
    ``Qwen3VLModel.save_pretrained`` writes them.
    """
    if layout not in ("embedding", "plain"):
        raise ValueError(f"layout must be 'embedding' or 'plain', got {layout!r}")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3VLConfig, Qwen3VLModel
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                   additional_special_tokens=list(SPECIAL_TOKENS[1:]))  # as the real one
    fast.save_pretrained(out)
    tid = fast.convert_tokens_to_ids
    Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                             image_mean=[0.5] * 3, image_std=[0.5] * 3,
                             size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128}).save_pretrained(out)
    head_dim = 16
    cfg = Qwen3VLConfig(
        text_config=dict(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=hidden // head_dim,
                         num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=4096,
                         pad_token_id=tid("<|endoftext|>"),
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=hidden,
                           num_position_embeddings=256, deepstack_visual_indexes=[1]),
        image_token_id=tid("<|image_pad|>"), video_token_id=tid("<|video_pad|>"),
        vision_start_token_id=tid("<|vision_start|>"), vision_end_token_id=tid("<|vision_end|>"))
    torch.manual_seed(seed)
    model = Qwen3VLModel(cfg).eval()
    model.save_pretrained(out)
    if layout == "embedding":
        import json

        from safetensors.torch import save_file

        for f in out.glob("model*.safetensors*"):
            f.unlink()
        state = {f"model.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((out / "config.json").read_text())
        config["architectures"] = ["Qwen3VLForEmbedding"]
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
