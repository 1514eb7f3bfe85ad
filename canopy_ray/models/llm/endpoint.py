"""An OpenAI-compatible server named on the command line (``--llm-url``, ``--llm-model``) as the
config's ``llm`` section: the reader and critic of ``canopy quickstart``, ``canopy eval`` and
``canopy sweep`` alike."""

from __future__ import annotations

import httpx

from canopy_ray.config import ConfigError


def reader_override(url: str, model: str | None = None, timeout: float = 10.0) -> dict:
    """The ``llm`` config section for an OpenAI-compatible server at ``url`` (ending in ``/v1``)
    as reader and critic. Without ``model``, the first model the server lists at ``/models``."""
    url = url.rstrip("/")
    if not model:
        try:
            r = httpx.get(f"{url}/models", timeout=timeout)
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
            raise ConfigError(f"cannot list the models at {url}/models ({type(e).__name__}: {e}): check that "
                              "the server runs there (its base URL ends in /v1), or name the model with "
                              "--llm-model") from None
    return {"backend": "openai", "url": url, "model": model}


def llm_override(url: str | None, model: str | None) -> dict:
    """The config override for ``--llm-url``/``--llm-model``: ``{"llm": ...}``, or ``{}`` without a URL."""
    if model and not url:
        raise ConfigError("--llm-model needs --llm-url (the OpenAI-compatible server that serves it)")
    return {"llm": reader_override(url, model)} if url else {}
