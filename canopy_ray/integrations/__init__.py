"""CANOPY as a drop-in step of RAG frameworks, after retrieval and before the reader.

- :mod:`.llamaindex`: :class:`~.llamaindex.CanopyPostprocessor`, a LlamaIndex node
  postprocessor (``pip install "canopy-ray[llamaindex]"``);
- :mod:`.langchain`: :class:`~.langchain.CanopyCompressor`, a LangChain document compressor
  for ``ContextualCompressionRetriever`` (``pip install "canopy-ray[langchain]"``).

Both compress in this process (:func:`canopy_ray.compress`, ``config`` a YAML path or a
:class:`~canopy_ray.config.CanopyConfig`) or against a served engine (``url``, through
:class:`canopy_ray.Client`). Each retrieved text becomes a canonical text item (``title`` from
the metadata key ``title_key``); the node or document keeps its id and metadata, its text
becomes the kept evidence, and ``metadata["canopy"]`` holds the token report
(``origin_tokens``, ``compressed_tokens``, ``ratio``) and the kept sentence spans. Empty texts
pass through unchanged; a text CANOPY leaves out (nothing of it kept: :func:`left_out`) is
dropped from the results, as LangChain's and LlamaIndex's own filters drop documents.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

REPORT_KEY = "canopy"


def text_item(item_id: str, title: str, text: str) -> dict:
    """The canonical text item of one retrieved text."""
    return {"id": item_id, "modality": "text", "title": title, "text": text}


@functools.lru_cache(maxsize=8)
def _client(url: str):
    from canopy_ray.client import Client

    return Client(url)


def compress_texts(query: str, texts: Sequence[tuple[str | None, str, str]], *, url: str | None = None,
                   config: Any = None, branching: int | None = None,
                   policy: str | None = None) -> list[tuple[str, dict] | None]:
    """Per ``(id, title, text)``: the kept evidence and the ``metadata["canopy"]`` report, or
    ``None`` for an empty text. Missing or repeated ids are replaced by positions."""
    import canopy_ray
    from canopy_ray.compressor import token_report

    todo = [i for i, (_, _, text) in enumerate(texts) if text and text.strip()]
    ids = [texts[i][0] for i in todo]
    if None in ids or len(set(ids)) < len(ids):
        ids = [str(i) for i in todo]
    items = [text_item(item_id, *texts[i][1:]) for item_id, i in zip(ids, todo)]
    out: list[tuple[str, dict] | None] = [None] * len(texts)
    if not items:
        return out
    results = (_client(url).compress(query, items, branching=branching, policy=policy) if url else
               canopy_ray.compress(query, items, config=config, branching=branching, policy=policy))
    for i, r in zip(todo, results, strict=True):
        out[i] = (r.evidence.text if r.kept else "", {**token_report([r]), "kept": [list(s) for s in r.kept]})
    return out


def left_out(result: tuple[str, dict] | None) -> bool:
    """Whether :func:`compress_texts` kept nothing of a text (its document is dropped)."""
    return result is not None and not result[1]["kept"]
