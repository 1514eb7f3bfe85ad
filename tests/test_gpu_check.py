"""scripts/gpu_check.py: its CPU smoke run passes every check, prints the table, and never loads
Ray, FAISS or vLLM (the device machine has none of them)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"

# runs the script as __main__ and reports, after it, which forbidden top-level packages it loaded
RUNNER = """
import json, runpy, sys
sys.argv = [{script!r}] + {args!r}
code = 0
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as e:
    code = e.code or 0
print("LOADED " + json.dumps(sorted({{m for m in sys.modules if m.split(".")[0] in ("ray", "faiss", "vllm")}})))
sys.exit(code)
"""

ROWS = [
    "MiniLM f0 encode | cpu float32", "MiniLM f_theta encode | cpu bfloat16",
    "MiniLM f0 bf16 vs fp32 | cpu", "MiniLM f_theta differs from f0",
    "Qwen3-VL f0 encode | cpu float32", "Qwen3-VL f_theta encode | cpu bfloat16",
    "Qwen3-VL f_theta bf16 vs fp32 | cpu", "Qwen3-VL image node encode | cpu bfloat16",
    "MiniLM LoRA gradients | cpu float32", "MiniLM LoRA step, CANOPY loss | cpu float32",
    "Qwen3-VL LoRA gradients | cpu float32", "Qwen3-VL LoRA step, CANOPY loss | cpu float32",
    "MiniLM node scoring (lazy refinement) | cpu float32",
    "Qwen3-VL node scoring (lazy refinement) | cpu float32",
]


def run_script(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    code = RUNNER.format(script=str(SCRIPT), args=list(args))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


@pytest.mark.integration
def test_cpu_smoke_run_passes_and_loads_no_ray_faiss_vllm():
    proc = run_script("--device", "cpu", "--quick")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| check | setting | result | ok |"
    body = table[1:]
    for name in ROWS:
        hits = [line for line in body if line.startswith(f"| {name}")]
        assert hits and all(line.endswith("| pass |") for line in hits), (name, body)
    assert not [line for line in body if "FAIL" in line]
    loaded = [line for line in proc.stdout.splitlines() if line.startswith("LOADED ")]
    assert loaded and json.loads(loaded[-1][len("LOADED "):]) == []


@pytest.mark.integration
def test_fp16_minilm_copy_is_small_and_encodes_alike(tmp_path):
    """--export-minilm writes a copy under 64 MB (to copy to a GPU machine without network) that
    --minilm-dir can use: same vectors as the packaged fp32 model to fp16 rounding."""
    from canopy_ray.models.encoder import TextEncoder

    proc = run_script("--export-minilm", str(tmp_path / "minilm"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    size = sum(p.stat().st_size for p in (tmp_path / "minilm").iterdir())
    assert size < 64 * 2**20
    texts = ["Paris is the capital of France.", "Saturn has 146 known moons."]
    ref = TextEncoder().encode_queries(texts)
    copy = TextEncoder(tmp_path / "minilm")
    copy.model.float()  # what gpu_check does: fp32 and bf16 are set explicitly
    got = copy.encode_queries(texts)
    assert np.abs(ref - got).max() < 2e-3 and (ref * got).sum(1).min() > 0.9999
