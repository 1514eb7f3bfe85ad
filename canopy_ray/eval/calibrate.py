"""Calibrating the refinement margin to a recall target (``canopy calibrate``).

The margin d (:mod:`canopy_ray.core.refine`) of Algorithm 1 (the policy ``canopy margin=d``, which
the curves run whatever the config's policy) trades reader tokens for kept answers. For every
``validation`` question of each set (given setting, the reader skipped), CANOPY runs at each
margin of a grid and the uncompressed loop (``no_projection``) once. Node vectors are encoded
at the first margin and served from the runner's vector cache at the others, and LLM calls
(the table classifier) are cached, so each further margin costs refinement and rendering only.

The chosen margin is the smallest-token one whose body answer recall over informative
questions is within ``target_loss`` of ``no_projection``'s on every set (the paired mean;
its 95% bootstrap interval is reported beside it); when no margin of the grid is, the
largest. ``calibration.json`` (read by the policy ``canopy margin=auto``), ``calibration.md`` and
``calibration.png`` are written beside the adapter (or to ``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Sequence

from canopy_ray.config import CALIBRATION_FILE
from canopy_ray.core.files import write_json, write_text
from canopy_ray.core.policy import Policy
from canopy_ray.eval.methods import get_method
from canopy_ray.eval.runs import Runner, load_eval_set, paired_differences

GRID = (0.0, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.08)
RECALL = "answer_recall_informative"
BASELINES = ("random", "flat_matched", "random_total")  # the matched-budget methods a curve can replay


def curve(runner: Runner, eval_set, grid: Sequence[float] = GRID, progress=None, matched: Sequence[str] = ()) -> dict:
    """``{"no_projection": {tokens, recall}, "points": [{margin, tokens, recall, delta...}]}``
    for one set: CANOPY at each margin against the uncompressed loop, paired on questions;
    ``matched`` baselines (``random``, ``flat_matched``) replayed at each point's budget."""
    base = runner.base_settings()
    ref = runner.run(eval_set, get_method("no_projection"), get_method("no_projection").settings(base), reader=False)
    ref_tokens = ref["aggregate"]["tokens"]["mean"]
    points = []
    for d in grid:  # "shipped" here: Algorithm 1 at d, the run the matched baselines replay
        at = dataclasses.replace(base, policy=Policy("canopy", margin=d))
        run = runner.run(eval_set, get_method("shipped"), at, reader=False)
        diff = paired_differences(run["records"], ref["records"], [RECALL, "answer_recall"])
        points.append({"margin": d, "tokens": run["aggregate"]["tokens"]["mean"],
                       "tokens_saved": 1 - run["aggregate"]["tokens"]["mean"] / ref_tokens,
                       "recall": run["aggregate"][RECALL]["mean"], "n_informative": diff[RECALL]["n"],
                       "delta": diff[RECALL], "delta_all": diff["answer_recall"]})
        for name in matched:  # replays this margin's CANOPY records: its items, its tokens per item
            m = get_method(name)
            other = runner.run(eval_set, m, at, reader=False)
            points[-1][name] = {"tokens": other["aggregate"]["tokens"]["mean"],
                                "delta": paired_differences(other["records"], ref["records"], [RECALL])[RECALL]}
        if progress:
            progress(f"{eval_set.name} margin {d}: {points[-1]['tokens']:.0f} tokens "
                     f"({points[-1]['tokens_saved']:+.1%} saved), Δrecall {diff[RECALL]['mean']:+.3f}")
    return {"n": len(eval_set.questions), "no_projection": {"tokens": ref_tokens, "recall": ref["aggregate"][RECALL]["mean"]},
            "points": points}


def choose(curves: dict, target_loss: float) -> float:
    """The margin with the fewest reader tokens (summed over sets) whose paired recall
    difference is >= -target_loss on every set; the largest margin when none is."""
    margins = [p["margin"] for p in next(iter(curves.values()))["points"]]
    ok = [i for i in range(len(margins))
          if all(c["points"][i]["delta"]["mean"] >= -target_loss for c in curves.values())]
    if not ok:
        return max(margins)
    return margins[min(ok, key=lambda i: sum(c["points"][i]["tokens"] for c in curves.values()))]


def markdown(curves: dict, chosen: float | None, target_loss: float, adapter: str, split: str = "validation") -> str:
    if chosen is None:
        head = f"# Refinement margin on the test split\n\nAdapter `{adapter}`; nothing is chosen here."
    else:
        head = (f"# Refinement margin, calibrated on validation\n\nAdapter `{adapter}`; target: body answer recall "
                f"(informative questions) within {target_loss:.3f} of `no_projection` on every set. Chosen margin: "
                f"**{chosen}**.")
    lines = [head + " Paired differences with 95% bootstrap intervals; tokens: the reader's evidence, mean per "
             "question. random / flat_matched (when shown): the same items, each at CANOPY's tokens for it; "
             "random_total: random leaves of any item at CANOPY's tokens for the question.", ""]
    for name, c in curves.items():
        lines += [f"## {name} ({split}, {c['n']} questions, given setting)", "",
                  f"no_projection: {c['no_projection']['tokens']:.0f} tokens, recall (informative) "
                  f"{c['no_projection']['recall']:.3f}", "",
                  "| margin | reader tokens | saved | recall, informative | n_inf | Δ vs no_projection | Δ all questions |"
                  + "".join(f" {b}: Δ vs no_projection |" for b in BASELINES if b in c["points"][0]),
                  "|---|---|---|---|---|---|---|" + "---|" * sum(b in c["points"][0] for b in BASELINES)]
        for p in c["points"]:
            d, a = p["delta"], p["delta_all"]
            mark = " (chosen)" if p["margin"] == chosen else ""
            extra = "".join(f" {p[b]['delta']['mean']:+.3f} [{p[b]['delta']['low']:+.3f}, {p[b]['delta']['high']:+.3f}] |"
                            for b in BASELINES if b in p)
            lines.append(f"| {p['margin']}{mark} | {p['tokens']:.0f} | {p['tokens_saved']:.1%} | {p['recall']:.3f} | "
                         f"{p['n_informative']} | {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] | "
                         f"{a['mean']:+.3f} [{a['low']:+.3f}, {a['high']:+.3f}] |{extra}")
        lines.append("")
    return "\n".join(lines)


def plot(curves: dict, chosen: float | None, path: Path, split: str = "validation") -> Path:
    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    for i, (name, c) in enumerate(curves.items()):
        xs = [p["tokens_saved"] for p in c["points"]]
        ys = [p["delta"]["mean"] for p in c["points"]]
        ax.plot(xs, ys, "-o", color=f"C{i}", label=f"{name} canopy (n={c['n']})")
        for p, x, y in zip(c["points"], xs, ys):
            ax.annotate(f"{p['margin']:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
        for style, base in zip((":", "--", "-."), BASELINES):
            if base in c["points"][0]:
                ax.plot(xs, [p[base]["delta"]["mean"] for p in c["points"]], style + "x", color=f"C{i}",
                        lw=0.8, label=f"{name} {base}")
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xlabel("reader tokens saved vs no_projection")
    ax.set_ylabel("Δ body answer recall, informative questions")
    ax.set_title(f"refinement margin, {split} split" + (f" (chosen {chosen})" if chosen is not None else ""),
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save(fig, path, 90)


def calibrate(cfg, data_dirs: dict[str, Path], target_loss: float, out_dir: Path, *, n: int | None = None,
              grid: Sequence[float] = GRID, client=None, llm_cache: str | None = None, progress=print,
              split: str | None = "validation", matched: Sequence[str] = ()) -> dict:
    """Run the curves and write them to ``out_dir``: on ``validation`` the calibration (the chosen
    margin, ``calibration.json``); on another split the curve alone (``margin_curve.*``), for
    reporting, choosing nothing."""
    from canopy_ray.eval.cache import CachedChatClient
    from canopy_ray.models.adapters import adapter_id
    from canopy_ray.models.llm import client_from_config

    client = client or client_from_config(cfg.llm)
    if llm_cache:
        client = CachedChatClient(client, llm_cache)
    runner = Runner(cfg, client)
    curves = {}
    for name, d in data_dirs.items():
        eval_set = load_eval_set(name, Path(d) / "questions.jsonl", Path(d) / "corpus.jsonl", n=n, split=split)
        curves[name] = curve(runner, eval_set, grid, progress, matched)
    calibrating = split == "validation" or split is None
    chosen = choose(curves, target_loss) if calibrating else None
    adapter = adapter_id(cfg.models.adapter)
    result = {"margin": chosen, "target_loss": target_loss, "adapter": adapter, "split": split,
              "metric": f"paired {RECALL}, canopy - no_projection, every set", "grid": list(grid), "curves": curves}
    out_dir, stem = Path(out_dir), Path(CALIBRATION_FILE).stem if calibrating else "margin_curve"
    write_json(out_dir / f"{stem}.json", result, indent=1)
    write_text(out_dir / f"{stem}.md", markdown(curves, chosen, target_loss, adapter, split or "all"))
    plot(curves, chosen, out_dir / f"{stem}.png", split or "all")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from canopy_ray.config import ConfigError, load_config
    from canopy_ray.core.errors import CanopyError
    from canopy_ray.data.sets import SHARED_SETS, default_shared_root, prepare_shared

    p = argparse.ArgumentParser(prog="canopy calibrate", description="Choose the refinement margin on validation "
                                "questions: the fewest reader tokens within --target-loss of the uncompressed loop.")
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--target-loss", type=float, default=0.01, help="allowed loss of body answer recall "
                   "(informative questions) against no_projection, per set (default %(default)s)")
    p.add_argument("--sets", nargs="+", default=list(SHARED_SETS), choices=list(SHARED_SETS))
    p.add_argument("--n", type=int, default=None, help="validation questions per set (default: all)")
    p.add_argument("--grid", default=",".join(map(str, GRID)), help="margins to try, comma separated")
    p.add_argument("--shared-data", default=default_shared_root())
    p.add_argument("--work-dir", default="runs/data", help="converted data sets go here")
    p.add_argument("--llm-cache", default="runs/llm.sqlite", help="SQLite file caching LLM replies")
    p.add_argument("--out", default=None, help="folder for calibration.json/.md/.png (default: beside the adapter)")
    p.add_argument("--split", default="validation", choices=["validation", "test"],
                   help="test: only report the curve (margin_curve.*), choosing nothing")
    p.add_argument("--matched", default="", help="baselines replayed at each point's budget, e.g. random,flat_matched")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, refinement={"policy": "canopy margin=0"})  # each run sets its own
        out = args.out or cfg.models.adapter
        if not out:
            raise ConfigError("the config has no adapter to calibrate beside: pass --out")
        dirs = prepare_shared(args.shared_data, args.work_dir, args.sets)
        grid = sorted(float(x) for x in args.grid.split(","))
        result = calibrate(cfg, dirs, args.target_loss, Path(out), n=args.n, grid=grid, llm_cache=args.llm_cache,
                           split=args.split, matched=[m for m in args.matched.split(",") if m])
    except (ConfigError, CanopyError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result["margin"] is None:
        print(f"wrote {out}/margin_curve.json, .md, .png")
    else:
        print(f"chosen margin {result['margin']} (target loss {args.target_loss}); wrote {out}/{CALIBRATION_FILE}, "
              f"calibration.md, calibration.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
