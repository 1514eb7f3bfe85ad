"""One token counter per configuration: the reader's own tokenizer.

The reader cap and every reported token count (before/after compression, the reader's
evidence) use the tokenizer of the model that reads the evidence: SmolLM2's for the local
CPU backend and for vLLM serving the packaged SmolLM2 (``configs/vllm-cpu.yaml``), the
tokenizer folder ``llm.tokenizer`` names for an endpoint (Qwen3-VL's on the GPU
configuration), and words and punctuation (:func:`count_words`) only when the
config names no tokenizer.
"""

from __future__ import annotations

import functools
from pathlib import Path

from canopy_ray.core.evidence import TokenCounter, count_words


@functools.lru_cache(maxsize=4)
def _hf_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def hf_token_counter(path: str | Path) -> TokenCounter:
    """``count_tokens(text)`` for a local Hugging Face tokenizer folder."""
    tok = _hf_tokenizer(str(path))
    return lambda text: len(tok.encode(text, add_special_tokens=False))


def token_counter(llm) -> TokenCounter:
    """The counter an ``LLMSection`` implies (see the module docstring)."""
    if llm.tokenizer:
        return hf_token_counter(llm.tokenizer)
    if _reads_smollm2(llm):
        from canopy_ray.models.llm.local import smollm2_token_counter

        return smollm2_token_counter(llm.cache_dir)
    return count_words


def reader_context(llm) -> int | None:
    """The critic's and reader's context window in tokens, where the config tells it: SmolLM2's
    for local, ``max_model_len`` for vllm, ``context_tokens`` for an endpoint or local-vl
    (None: unknown, the evidence cap alone applies)."""
    if llm.context_tokens:
        return llm.context_tokens
    if llm.backend == "local":
        from canopy_ray.models.llm.local import SMOLLM2_CONTEXT

        return SMOLLM2_CONTEXT
    return llm.max_model_len if llm.backend == "vllm" else None


def counter_name(llm) -> str:
    """What the counts are in, for reports."""
    return llm.tokenizer or ("SmolLM2 tokens" if _reads_smollm2(llm) else "words")


def _reads_smollm2(llm) -> bool:
    from canopy_ray.models.llm.local import SMOLLM2_SOURCE

    return llm.backend == "local" or (llm.backend == "vllm" and llm.model_source == SMOLLM2_SOURCE)
