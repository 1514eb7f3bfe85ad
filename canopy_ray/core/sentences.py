"""Sentence splitting for text items given as one string.

pysbd is a rule-based splitter (pure Python, no model download) that handles
abbreviations, decimals and quotes far better than a regex.
"""

from functools import lru_cache


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(text: str) -> list[str]:
    sentences = [s.strip() for s in _segmenter().segment(text)]
    return [s for s in sentences if s] or [text.strip()]
