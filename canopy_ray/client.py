"""``canopy_ray.Client``: the served engine (``canopy serve``) from Python.

    client = canopy_ray.Client("http://127.0.0.1:8000")
    results = client.compress("Which planet has 95 moons?", items)  # ItemResults, as canopy_ray.compress
    print(canopy_ray.token_report(results))                          # origin_tokens, compressed_tokens, ratio
    client.answer("When was the Eiffel Tower built?", k=5)           # the /v1/answer JSON

Items are parsed here (a bad one raises :class:`~canopy_ray.core.errors.ItemError` before any
request) and sent in canonical form. Each result's tree is rebuilt here with the server's
hierarchy settings (``GET /v1/config``, read once), so it carries the same tree, kept spans,
evidence and token counts as :func:`canopy_ray.compress`. Node scores travel only with
``explain=True``; without it ``scores`` is empty and every node's fate follows from the kept
spans. A non-2xx answer raises :class:`ServiceError`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import httpx

from canopy_ray.compressor import ItemResult
from canopy_ray.core.evidence import piece
from canopy_ray.core.hierarchy import ItemTree, Span
from canopy_ray.core.items import item_to_dict, parse_item
from canopy_ray.core.refine import DROPPED, KEPT, SPLIT, WITHIN


class ServiceError(Exception):
    """A non-2xx answer: ``status``, the server's ``reason`` code, ``message`` and the JSON ``body``."""

    def __init__(self, status: int, reason: str, message: str, body: Any = None):
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status, self.reason, self.message, self.body = status, reason, message, body

    @classmethod
    def from_response(cls, r: httpx.Response) -> "ServiceError":
        try:
            body = r.json()
            err = body.get("error", {}) if isinstance(body, dict) else {}
        except ValueError:
            body, err = r.text, {}
        reason = err.get("reason") or err.get("code") or r.reason_phrase
        return cls(r.status_code, str(reason), str(err.get("message") or body)[:500], body)


def _fates(tree: ItemTree, kept: Sequence[Span]) -> dict[Span, str]:
    """Every node's fate from the kept spans alone, as refinement set them: a kept node's
    ancestors split, the nodes inside it are within it, every other node was dropped."""
    out = {}
    for node, _ in tree.root.walk():
        a, b = node.span
        if node.span in kept:
            out[node.span] = KEPT
        elif any(a <= s and e <= b for s, e in kept):
            out[node.span] = SPLIT
        else:
            out[node.span] = WITHIN if any(s <= a and b <= e for s, e in kept) else DROPPED
    return out


class Client:
    """The canopy-ray HTTP API: :meth:`compress`, :meth:`answer`, :meth:`healthz`, :meth:`config`.

    ``url`` is the server's root (``http://127.0.0.1:8000``); ``timeout`` bounds each request.
    One connection pool, reused; close it with :meth:`close` or a ``with`` block.
    """

    def __init__(self, url: str = "http://127.0.0.1:8000", *, timeout: float = 300.0,
                 headers: dict[str, str] | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)
        self._builder = None  # a Compressor with the server's hierarchy, for its trees only

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        r = self._http.request(method, path, json=body)
        if r.status_code >= 400:
            raise ServiceError.from_response(r)
        return r.json()

    def healthz(self) -> dict:
        return self._call("GET", "/healthz")

    def config(self) -> dict:
        """The server's config, its index and its compression counters (``GET /v1/config``)."""
        return self._call("GET", "/v1/config")

    def _trees(self):
        if self._builder is None:
            from canopy_ray.compressor import Compressor
            from canopy_ray.config import load_config

            cfg = load_config(None, hierarchy=self.config()["hierarchy"])
            self._builder = Compressor.from_config(cfg, None, cache=None)
        return self._builder

    def compress(self, query: str, items: Sequence[Any], *, branching: int | None = None, explain: bool = False,
                 node_encoder: str = "tuned", policy: str | None = None) -> list[ItemResult]:
        """``POST /v1/compress``: one :class:`~canopy_ray.compressor.ItemResult` per item, as
        :func:`canopy_ray.compress` returns (node scores only with ``explain``)."""
        parsed = [parse_item(it) if isinstance(it, dict) else it for it in items]
        body = {"query": query, "items": [item_to_dict(it) for it in parsed], "explain": explain,
                "node_encoder": node_encoder}
        body |= {k: v for k, v in (("branching", branching), ("policy", policy))
                 if v is not None}
        out = self._call("POST", "/v1/compress", body)["items"]
        trees = [self._trees().tree(it, branching=branching) for it in parsed]
        return [self._result(t, d, explain) for t, d in zip(trees, out, strict=True)]

    @staticmethod
    def _result(tree: ItemTree, d: dict, explain: bool) -> ItemResult:
        if explain:
            r = ItemResult.from_dict(tree, d)
        else:
            kept = [tuple(s) for s in d["kept"]]
            r = ItemResult(tree, {}, _fates(tree, kept), kept, d["tokens_before"], d["tokens_after"],
                           piece(tree, kept))
        return replace(r, encoded=d.get("nodes_encoded", 0), encoded_tokens=d.get("encoded_tokens", 0))

    def answer(self, question: str, **options) -> dict:
        """``POST /v1/answer`` against the served index; ``options``: ``k``, ``rounds``,
        ``branching``, ``policy``, ``explain``. Returns the JSON answer (answer, evidence, ...)."""
        return self._call("POST", "/v1/answer", {"question": question, **options})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
