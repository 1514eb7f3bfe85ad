"""One HTTP request to the application and what came back: its status (or why none came), when it
was sent and answered, the reason of a JSON error body and ``Retry-After``. The node-loss runs and
``benchmarks/faults.py`` send their load through :func:`send`."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx


@dataclass
class Reply:
    status: int | str  # the HTTP status, or the exception's name (a reset connection, a hang)
    sent: float
    done: float
    json_reason: str | None  # error.reason of a JSON error body (None: not JSON or no reason)
    retry_after: str | None
    body: dict | None = None  # of a 200
    content_type: str | None = None  # e.g. text/plain: Serve's proxy answered, not the Ingress

    @property
    def seconds(self) -> float:
        return self.done - self.sent


async def send(client: httpx.AsyncClient, url: str, body: str, hang_s: float) -> Reply:
    t0 = time.perf_counter()
    try:
        r = await client.post(url, content=body, headers={"content-type": "application/json"}, timeout=hang_s)
    except httpx.TimeoutException:
        return Reply("hung", t0, time.perf_counter(), None, None)
    except httpx.HTTPError as e:
        return Reply(type(e).__name__, t0, time.perf_counter(), None, None)
    try:
        data = r.json()
    except ValueError:
        data = None
    reason = data.get("error", {}).get("reason") if isinstance(data, dict) and "error" in data else None
    return Reply(r.status_code, t0, time.perf_counter(), reason, r.headers.get("retry-after"),
                 data if r.status_code == 200 else None, r.headers.get("content-type"))
