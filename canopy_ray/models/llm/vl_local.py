"""An in-process multimodal LLM: a Qwen3-VL generation checkpoint behind the chat-completions protocol.

``llm.backend: local-vl`` with ``llm.model_dir`` a Qwen3-VL Instruct folder (config, weights,
tokenizer, processor configs, chat template): critic and reader get the ``image_url`` parts that
:mod:`.vision` builds, decoded here from their data URIs to PIL images and given to the
checkpoint's processor together with the chat template's text, as the model card does. Only
``data:`` URIs are read (the server never fetches a URL). On a GPU pass ``device="cuda"``
(bf16); tests run a tiny random checkpoint on CPU.

It answers the same requests as :mod:`.local` (the ``ChatRequest`` checks of
:func:`~canopy_ray.models.llm.protocol.validate_request` apply to everything but the image
parts); JSON output is constrained with the same xgrammar schema grammars, through
``xgrammar.contrib.hf.LogitsProcessor`` around ``model.generate`` (Qwen3-VL's prefill computes
its multimodal rotary positions, so ``generate`` owns the loop here). Decoding is greedy; replies
come whole (no streaming).

The processor: ``AutoProcessor`` when it loads; without torchvision (which the video processor
needs) a ``Qwen3VLProcessor`` from the image processor and tokenizer alone, since video frames
arrive as images.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import threading
from pathlib import Path
from typing import Any, Sequence

from canopy_ray.models.llm.local import Generation, LocalChatClient, _decoding, _validated, completion_body
from canopy_ray.models.llm.protocol import LLMRequestError, validate_request
from canopy_ray.models.threads import torch_threads

IMAGE_PART = {"type": "image"}  # what the Qwen3-VL chat template turns into vision tokens


def decode_data_uri(url: Any, where: str):
    """A ``data:image/...;base64,`` URI as an RGB PIL image; anything else is a 400."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
        raise LLMRequestError(f"{where}.image_url.url must be a base64 data:image/ URI (URLs are not fetched)",
                              param=where, code="unsupported_content")
    try:
        raw = base64.b64decode(url.split(",", 1)[1], validate=True)
        with Image.open(io.BytesIO(raw)) as im:
            return im.convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as e:
        raise LLMRequestError(f"{where}: the image cannot be decoded ({e})", param=where,
                              code="invalid_image") from None


def split_images(messages: Any) -> tuple[list, list, list]:
    """(messages with image parts dropped, for :func:`validate_request`; messages for the chat
    template, image parts as ``{"type": "image"}``; the decoded images in prompt order)."""
    if not isinstance(messages, list):
        return messages, [], []
    text_only, templated, images = [], [], []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            text_only.append(m)
            templated.append(m)
            continue
        kept, parts = [], []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                where = f"messages[{i}].content[{j}]"
                image_url = part.get("image_url")
                images.append(decode_data_uri(image_url.get("url") if isinstance(image_url, dict) else None, where))
                parts.append(IMAGE_PART)
            else:
                kept.append(part)
                parts.append(part)
        text_only.append({**m, "content": kept or ""})
        templated.append({**m, "content": parts})
    return text_only, templated, images


def _template_messages(templated: list, validated: Sequence[dict]) -> list[dict]:
    """The validated roles ("developer" read as "system") with the multimodal content."""
    return [{"role": v["role"], "content": t["content"] if isinstance(t.get("content"), list) else v["content"]}
            for t, v in zip(templated, validated)]


class QwenVLBackend:
    """A Qwen3-VL ``ForConditionalGeneration`` checkpoint, greedy, optionally JSON-constrained.

    ``inputs`` (the processor's output for a request) is public so a caller can see what the
    model is given; generation is serialised by a lock.
    """

    def __init__(self, model_dir: str | Path, *, device: str = "cpu", dtype: str | None = None,
                 max_new_tokens: int = 64, max_tokens_limit: int = 512, threads: int | None = None,
                 model_name: str | None = None):
        import torch
        import xgrammar as xgr
        from transformers import Qwen3VLForConditionalGeneration

        self.threads = threads  # set around generation only: torch's count is process-wide
        self.model_dir = Path(model_dir)
        self.model_name = model_name or self.model_dir.name
        self.device = device
        torch_dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if device.startswith("cuda")
                                                           else torch.float32)
        self.model = Qwen3VLForConditionalGeneration.from_pretrained(
            self.model_dir, dtype=torch_dtype, local_files_only=True).to(device).eval()
        self.processor = load_processor(self.model_dir)
        self.tokenizer = self.processor.tokenizer
        self.max_new_tokens, self.max_tokens_limit = max_new_tokens, max_tokens_limit
        text_cfg = self.model.config.text_config
        self.context_window = int(getattr(text_cfg, "max_position_embeddings", 8192))
        self.eos_ids = self._eos_ids()
        info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=int(text_cfg.vocab_size),
                                                  stop_token_ids=self.eos_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=max(1, threads or 1))
        self._grammars: dict = {}
        pad = self.tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else self.eos_ids[0]
        self._lock = threading.Lock()

    def _eos_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        extra = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
        return sorted(i for i in ids if isinstance(i, int) and i >= 0 and i != self.tokenizer.unk_token_id)

    def grammar(self, fmt: str, schema: dict | None):
        if fmt == "text":
            return None
        key = (fmt, json.dumps(schema) if schema is not None else None)
        if key not in self._grammars:
            try:
                self._grammars[key] = (self._compiler.compile_builtin_json_grammar() if fmt == "json_object"
                                       else self._compiler.compile_json_schema(key[1], any_whitespace=False,
                                                                               strict_mode=True))
            except Exception as e:  # as in .local: an unsupported schema is the request's fault
                raise LLMRequestError(f"response_format schema cannot be compiled to a grammar: {e}",
                                      param="response_format.json_schema.schema", code="invalid_schema") from None
        return self._grammars[key]

    def inputs(self, messages: Sequence[dict], images: Sequence) -> Any:
        """The processor's tensors for one prompt: ``input_ids`` (each image's ``<|image_pad|>``
        run expanded to its merged patches), and with images ``pixel_values``/``image_grid_thw``."""
        text = self.processor.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        if images:
            return self.processor(text=[text], images=list(images), return_tensors="pt")
        return self.processor(text=[text], return_tensors="pt")

    def generate(self, messages: Sequence[dict], images: Sequence = (), *, fmt: str = "text",
                 schema: dict | None = None, max_new_tokens: int | None = None,
                 stop: Sequence[str] = ()) -> Generation:
        import torch
        import xgrammar as xgr

        limit = max_new_tokens or self.max_new_tokens
        if limit > self.max_tokens_limit:
            raise LLMRequestError(f"max_tokens {limit} exceeds this server's limit {self.max_tokens_limit}",
                                  param="max_tokens")
        compiled = self.grammar(fmt, schema)
        batch = self.inputs(messages, images)
        n_prompt = int(batch["input_ids"].shape[1])
        if n_prompt + limit > self.context_window:
            raise LLMRequestError(f"the prompt has {n_prompt} tokens; with max_tokens {limit} it exceeds the "
                                  f"context window of {self.context_window} tokens", param="messages",
                                  code="context_length_exceeded")
        extra = dict(stop_strings=list(stop), tokenizer=self.tokenizer) if stop else {}
        procs = [xgr.contrib.hf.LogitsProcessor(compiled)] if compiled is not None else []
        with self._lock, torch.inference_mode(), torch_threads(self.threads):
            out = self.model.generate(**batch.to(self.device), max_new_tokens=limit, do_sample=False,
                                      logits_processor=procs, eos_token_id=self.eos_ids,
                                      pad_token_id=self._pad_id, **extra)
        new = out[0, n_prompt:].tolist()
        ended = bool(new) and new[-1] in self.eos_ids
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        finish = "stop" if ended or cut >= 0 or len(new) < limit else "length"
        return Generation(text, n_prompt, len(new), finish)

    def handle_chat_completion(self, request: Any) -> dict:
        return handle_chat_completion(request, self)


def load_processor(model_dir: Path):
    """The checkpoint's processor; without torchvision, one without a video processor."""
    from transformers import AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(model_dir, local_files_only=True)
    except ImportError:  # the video processor needs torchvision; frames come as images anyway
        from canopy_ray.models.qwen3vl import _load_image_processor

        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        return _image_only_processor_class()(image_processor=_load_image_processor(model_dir), tokenizer=tok,
                                                 video_processor=None,
                                                 chat_template=_chat_template(model_dir, tok))


def _image_only_processor_class():
    from transformers import Qwen3VLProcessor

    class ImageOnlyProcessor(Qwen3VLProcessor):
        """Qwen3VLProcessor with no video processor (its class check would import torchvision)."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyProcessor


def _chat_template(model_dir: Path, tok) -> str | None:
    """The checkpoint's chat template: ``chat_template.json`` (Qwen's files), the ``.jinja`` file
    or the tokenizer's."""
    js = model_dir / "chat_template.json"
    if js.is_file():
        return json.loads(js.read_text())["chat_template"]
    jinja = model_dir / "chat_template.jinja"
    return jinja.read_text() if jinja.is_file() else tok.chat_template


def handle_chat_completion(request: Any, backend: QwenVLBackend) -> dict:
    """OpenAI ``POST /v1/chat/completions`` with image parts; :class:`LLMRequestError` for a 4xx."""
    if not isinstance(request, dict):
        validate_request(request)  # raises the protocol's error for a body that is not an object
    text_only, templated, images = split_images(request.get("messages"))
    req = _validated({**request, "messages": text_only}, backend)
    gen = backend.generate(_template_messages(templated, req.messages), images, **_decoding(req))
    return completion_body(backend.model_name, gen)


class VLChatClient(LocalChatClient):
    """The in-process :class:`~canopy_ray.models.llm.protocol.ChatClient` of a :class:`QwenVLBackend`."""
