"""Paths of the evaluation tests' tiny question set (the local Ray is the session-wide ``ray_local``)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "eval"
QUESTIONS, CORPUS = FIXTURES / "questions.jsonl", FIXTURES / "corpus.jsonl"
