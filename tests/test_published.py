"""What the project publishes speaks of the project, and its documented commands are run or marked.

- No tracked file cites this project's own tracker numbers, speaks of the machinery it was built
  with (the words are in ``MACHINERY``), or holds an absolute home or work path. Upstream issues
  of other projects may be cited by their full name (``ray-project/ray#123``, a github.com URL).
- The README is short: at most 250 lines, the two commands in its first 30, every docs page
  linked; its quickstart output is the recorded run's.
- Every shell block on a docs page is run by something named right before it ("Run by `PATH`."),
  or marked with what it needs ("Needs a GPU.", "Needs several machines."), or the page's
  introduction names the test that runs its command blocks. A test named so must name the page.

Each test lists every hit as ``file:line``, so what remains is visible at once.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
TWO_COMMANDS = ("bash scripts/setup.sh && .venv/bin/canopy quickstart --config configs/cpu.yaml",
                "bash scripts/test.sh")

# Phrases about how the project was built rather than what it is, as word sequences (kept apart here
# so that this file, which the check skips, does not read as one of them to other tools)
MACHINERY = [("device", "runs?"), ("helpers'",), ("helper", "(?:sessions?|tests?)"), ("what", "we", "aimed", "for"),
             ("may", "carry"), ("carry", "limit")]
# an upstream reference on the same line excuses a tracker-number hit: owner/repo#N or a GitHub URL
UPSTREAM = re.compile(r"[\w.-]+/[\w.-]+#\d+|github\.com/")
RULES = {
    "tracker number": re.compile(r"\b(?:[Ii]ssues?|PR|[Pp]ull request)\s*#?\d+\b"),
    "development machinery": re.compile("|".join(r"\b" + " ".join(words) + ("" if words[-1].endswith("'") else r"\b")
                                                 for words in MACHINERY), re.IGNORECASE),
    # /home/ubuntu is the login of cluster.yaml's machines (a path there, not of a machine this ran on)
    "absolute path": re.compile(r"(?<![\w.~/-])(?:/(?:work|root|Users)/|/home/(?!ubuntu\b)[A-Za-z_][\w.-]*)"),
}


def tracked_text_files() -> list[Path]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing is tracked")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    out = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path == Path(__file__).resolve():
            continue
        head = path.read_bytes()[:8192]
        if b"\0" in head:  # PNGs, safetensors and other binaries
            continue
        out.append(path)
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def hits(paths: list[Path]) -> dict[str, list[str]]:
    found = {rule: [] for rule in RULES}
    for path in paths:
        text = path.read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            for rule, pattern in RULES.items():
                match = pattern.search(line)
                if match and not (rule == "tracker number" and UPSTREAM.search(line)):
                    found[rule].append(f"{_rel(path)}:{n}: {line.strip()[:120]}")
    return found


def test_the_rules_catch_what_they_name(tmp_path):
    bad = tmp_path / "bad.md"
    # the phrases assembled, as in MACHINERY, so that this file does not read as one of them
    bad.write_text("Kill -9 (issue" + " 16)\nMeasured while helpers" + "' tests ran\n"
                   "the 64 MB a device" + " run may carry\nadapter `/" + "work/main/x`\n"
                   "see /home/alice/notes\nas in ray-project/ray#51234\n"
                   "what we aimed for\nPR #7 fixed it\n")
    found = hits([bad])
    lines = {rule: [h.split(":")[1] for h in found[rule]] for rule in found}
    assert lines == {"tracker number": ["1", "8"], "development machinery": ["2", "3", "7"],
                     "absolute path": ["4", "5"]}


def test_no_tracked_file_speaks_of_anything_but_the_project():
    paths = tracked_text_files()
    assert len(paths) > 100  # git ls-files worked
    found = hits(paths)
    report = "\n".join(f"{rule}:\n  " + "\n  ".join(lines) for rule, lines in found.items() if lines)
    assert not report, "\n" + report


def test_readme_is_short_and_links_every_docs_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    first = "\n".join(lines[:30])
    for cmd in TWO_COMMANDS:
        assert cmd in first, cmd
    text = "\n".join(lines)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and [p for p in pages if f"(docs/{p})" not in text] == []


def test_readme_quickstart_output_is_the_recorded_run():
    """The README's quickstart output is pasted from results/quickstart/output.txt: every line of
    its block but the "..." that trims it is a line of that file, in the file's order."""
    text = (ROOT / "README.md").read_text()
    assert "results/quickstart/output.txt" in text
    block = text.split("\n```\n[1/3] ", 1)[1].split("\n```", 1)[0].splitlines()
    recorded = (ROOT / "results" / "quickstart" / "output.txt").read_text().splitlines()
    at = 0
    for line in ["[1/3] " + block[0]] + block[1:]:
        if line.strip() in ("", "..."):
            continue
        assert line in recorded[at:], line
        at = recorded.index(line, at) + 1


FENCE = re.compile(r"^```(\w*)\s*$")
SHELL = {"bash", "sh", "shell", "console", "zsh"}
RUN_BY = re.compile(r"^Run by `([^`]+)`")
PAGE_TEST = re.compile(r"`(tests/[\w/]+\.py)`[^.]*?(?:command blocks of this page|commands below)", re.S)


def shell_blocks(lines: list[str]):
    """(line number of the opening fence, the paragraph right before it) for each shell block."""
    inside = False
    for i, line in enumerate(lines):
        m = FENCE.match(line.strip())
        if not m:
            continue
        if not inside and m.group(1) in SHELL:
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            start = j
            while start > 0 and lines[start - 1].strip():
                start -= 1
            yield i + 1, " ".join(lines[start:j + 1]).strip()
        inside = not inside


def unmarked_blocks(page: Path) -> list[str]:
    rel = str(page.relative_to(ROOT))
    text = page.read_text()
    lines = text.splitlines()
    intro = text.split("\n## ", 1)[0]
    page_test = PAGE_TEST.search(intro)
    covered = page_test is not None and rel in (ROOT / page_test.group(1)).read_text()
    bad = []
    for n, before in shell_blocks(lines):
        run_by = RUN_BY.match(before)
        if run_by:
            runner = ROOT / run_by.group(1)
            if not runner.is_file():
                bad.append(f"{rel}:{n}: names {run_by.group(1)}, which does not exist")
            elif run_by.group(1).startswith("tests/") and rel not in runner.read_text():
                bad.append(f"{rel}:{n}: {run_by.group(1)} does not name {rel}")
        elif not (before.startswith("Needs ") or covered):
            bad.append(f"{rel}:{n}: neither run by a named test or script nor marked with what it needs")
    return bad


def test_every_shell_block_on_the_docs_pages_is_run_or_marked():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages
    bad = [b for page in pages for b in unmarked_blocks(page)]
    assert not bad, "\n" + "\n".join(bad)


def test_the_block_check_catches_an_unmarked_block(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("runs nothing of the page")
    page = docs / "p.md"
    page.write_text("# P\n\nintro\n\n## A\n\nJust prose.\n\n```bash\nls\n```\n\n"
                    "Needs a GPU.\n\n```bash\nnvidia-smi\n```\n\n"
                    "Run by `tests/test_x.py`.\n\n```bash\nls -l\n```\n\n"
                    "Run by `scripts/none.sh`.\n\n```bash\nls -a\n```\n\n```python\nprint(1)\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    bad = unmarked_blocks(page)
    assert [b.split(":")[1] for b in bad] == ["9", "21", "27"], bad
