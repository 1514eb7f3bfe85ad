"""Build the bundled sample corpus (canopy_ray/assets/sample/) from ../shared/data.

    python scripts/make_sample.py [--shared ../shared/data]

Takes held-out ("test" split) questions only, so the shipped adapter never trained on them:
HotpotQA dev questions with their 10 paragraphs each, NQ questions with their gold passage,
TAT-QA documents (table + paragraphs) with their questions, plus one image and one looped
video made from the shared media. Deterministic: the same inputs give the same files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from canopy_ray.data.convert import convert
from canopy_ray.core.items import parse_question
from canopy_ray.core.splits import assign_splits

OUT = Path(__file__).resolve().parents[1] / "canopy_ray" / "assets" / "sample"


def _load(d: Path):
    items = {o["id"]: o for o in map(json.loads, (d / "corpus.jsonl").open())}
    return items, [json.loads(line) for line in (d / "questions.jsonl").open()]


def _take(fmt: str, raw: Path, n_questions: int, tmp: Path, whole_candidates: bool):
    convert(fmt, raw, tmp / fmt)
    items, questions = _load(tmp / fmt)
    splits = assign_splits(parse_question(q) for q in questions)
    chosen = [q for q in questions if splits[q["id"]] == "test"][:n_questions]
    keep = set()
    for q in chosen:
        keep.update(q["candidates"] if whole_candidates else [g["item_id"] for g in q["gold"]])
    for q in chosen:
        q["candidates"] = [c for c in q["candidates"] if c in keep]
    return [items[i] for i in sorted(keep)], chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    args = p.parse_args(argv)
    shared = Path(args.shared)
    (OUT / "media").mkdir(parents=True, exist_ok=True)
    corpus, questions = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for fmt, raw, n, whole in (
                ("hotpotqa", shared / "hotpotqa/hotpotqa_distractor_dev700.jsonl", 20, True),
                ("nq", shared / "nq/nq_open_oracle_1655.jsonl.gz", 40, False),
                ("tatqa", shared / "tatqa/tatqa_dev.json", 12, True)):
            items, qs = _take(fmt, raw, n, tmp, whole)
            corpus += items
            questions += qs
    shutil.copyfile(shared / "media" / "rocket.jpg", OUT / "media" / "rocket.jpg")
    # 13 loops of the 5.3 s clip = 69 s: two 30-second segments, small enough to ship.
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-stream_loop", "12", "-i",
                    str(shared / "media" / "bigbuckbunny.mp4"), "-vf", "scale=320:-2", "-an",
                    "-c:v", "libx264", "-crf", "34", "-preset", "veryslow", str(OUT / "media" / "bunny69s.mp4")],
                   check=True)
    duration = float(subprocess.run(["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of",
                                     "csv=p=0", str(OUT / "media" / "bunny69s.mp4")],
                                    capture_output=True, text=True, check=True).stdout)
    corpus += [
        {"id": "media:rocket", "modality": "image", "title": "Rocket launch", "path": "media/rocket.jpg",
         "caption": "A white rocket standing on its launch pad at dusk, between lightning towers and floodlights."},
        {"id": "media:bunny", "modality": "video", "title": "Big Buck Bunny: a large rabbit stretches outside his burrow in a grassy meadow (looped clip)",
         "path": "media/bunny69s.mp4", "duration_s": round(duration, 2), "transcript": []},
    ]
    with (OUT / "corpus.jsonl").open("w") as f:
        f.writelines(json.dumps(o, ensure_ascii=False) + "\n" for o in corpus)
    with (OUT / "questions.jsonl").open("w") as f:
        f.writelines(json.dumps(q, ensure_ascii=False) + "\n" for q in questions)
    print(f"{len(corpus)} items, {len(questions)} questions -> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
