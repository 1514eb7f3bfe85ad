"""Sweeps over k and B (and the ablation's methods), parallel over Ray, resumable.

A sweep spec (``configs/sweep.yaml``, :class:`SweepSpec`) names data sets, grids (methods x k
x B; a grid may skip the reader, for reader-independent metrics at no LLM cost) and the
ablation (every method at one k and B). :func:`expand` turns it into *points*;
each point is one run (:class:`canopy_ray.eval.runs.Runner`) written to
``OUT/points/<dataset>/<method>_k<k>_B<B>_n<n>.json``. Methods that pass items whole do not
depend on B and are run once, at the ablation's B.

Parallelism: a Ray Data callable class over the pending points with an autoscaling actor
pool, ``ActorPoolStrategy(min_size, max_size)``. Each actor loads the encoder and the reader
once and then runs whole points; the pool grows toward ``max_actors`` while points are
queued and shrinks when they run out. One point in flight per actor: points are few and
long, so none should wait behind a busy actor while another is idle. Chosen over Ray Tune's
grid because a point is not a trial to be scheduled and stopped early but a batch job whose
expensive state (the models) should outlive it, and over ``ray.util.ActorPool`` because that pool is fixed in size. The
driver writes each point's JSON (atomically) as its row comes back, so a killed sweep keeps
every finished point; a rerun skips points whose file records the same point (spec, sample,
config), and reruns the others. All actors share one SQLite cache of LLM replies
(:class:`canopy_ray.eval.cache.CachedChatClient`), so a point interrupted half way costs
little to redo.

After the points, :func:`canopy_ray.eval.report.write_report` writes ``OUT/results.md`` and
the PNG plots. :func:`main` is the command line (``jobs/sweep.py``, ``canopy sweep``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Callable, Literal

import yaml
from pydantic import Field, model_validator

from canopy_ray.config import Section, portable_path
from canopy_ray.core.files import digest, write_json
from canopy_ray.eval.methods import METHODS, get_method
from canopy_ray.eval.runs import SETTINGS


class DatasetSpec(Section):
    """Canonical files (``questions`` + ``corpus``), or a raw shared file converted on first use
    (``format`` + ``raw``); ``index`` for the open setting."""

    questions: str | None = None
    corpus: str | None = None
    format: Literal["hotpotqa", "nq", "tatqa"] | None = None
    raw: str | None = None
    n_distractors: int = Field(9, ge=0, description="nq: distractor passages per question")
    index: str | None = None

    @model_validator(mode="after")
    def _source(self):
        if not self.questions and not (self.format and self.raw):
            raise ValueError("a data set needs 'questions' (+ 'corpus') or 'format' + 'raw'")
        return self


class GridSpec(Section):
    methods: list[str] = ["shipped", "vanilla"]
    k: list[int] = [5, 10, 20]
    branching: list[int] = [2, 3, 4]
    questions: int | None = Field(None, ge=1, description="sample size (default: the sweep's)")
    reader: bool = Field(True, description="False: skip the reader (reader-independent metrics only)")


class AblationSpec(Section):
    methods: list[str] = list(METHODS)
    k: int = 10
    branching: int = 2
    questions: int | None = Field(None, ge=1)


class PoolSpec(Section):
    min_actors: int = Field(1, ge=1)
    max_actors: int = Field(2, ge=1)
    cpus_per_actor: float = Field(1.0, gt=0)


class SweepSpec(Section):
    config: str = "configs/cpu.yaml"
    setting: Literal["given", "open"] = "given"
    questions: int | None = Field(40, ge=1, description="questions per data set (fixed sample)")
    seed: int = 0
    split: Literal["train", "validation", "test"] | None = None
    flat_m: int | None = Field(None, ge=1)
    work_dir: str = "runs/eval-data"
    llm_cache: bool = True
    datasets: dict[str, DatasetSpec]
    grids: list[GridSpec] = [GridSpec()]
    ablation: AblationSpec | None = AblationSpec()
    pool: PoolSpec = PoolSpec()

    @model_validator(mode="after")
    def _check(self):
        for m in [m for g in self.grids for m in g.methods] + (self.ablation.methods if self.ablation else []):
            get_method(m)
        if self.pool.min_actors > self.pool.max_actors:
            raise ValueError("pool.min_actors > pool.max_actors")
        if self.setting not in SETTINGS:
            raise ValueError(f"setting must be one of {SETTINGS}")
        return self


def load_spec(path: str | Path, **overrides) -> SweepSpec:
    data = yaml.safe_load(Path(path).read_text()) or {}
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict):
            data[key] = {**data.get(key, {}), **value}
        else:
            data[key] = value
    return SweepSpec.model_validate(data)


def point_key(p: dict) -> str:
    suffix = "" if p.get("reader", True) else "_noreader"
    return f"{p['dataset']}/{p['method']}_k{p['k']}_B{p['branching']}_n{p['n']}{suffix}"


def expand(spec: SweepSpec, config_digest: str = "") -> list[dict]:
    """Every point of the sweep, deduplicated; a point lists the roles it plays (grid, ablation)."""
    points: dict[str, dict] = {}
    b_default = spec.ablation.branching if spec.ablation else min(b for g in spec.grids for b in g.branching)

    def add(dataset, method, k, b, n, role, reader=True):
        if not get_method(method).uses_branching:
            b = b_default
        p = {"dataset": dataset, "method": method, "k": k, "branching": b, "n": n, "seed": spec.seed,
             "split": spec.split, "setting": spec.setting, "flat_m": spec.flat_m, "reader": reader,
             "config": config_digest}
        key = point_key(p)
        points.setdefault(key, p | {"roles": []})
        if role not in points[key]["roles"]:
            points[key]["roles"].append(role)

    def grid(g: GridSpec):
        for name in spec.datasets:
            for m in g.methods:
                for k in g.k:
                    for b in g.branching:
                        add(name, m, k, b, g.questions or spec.questions, "grid", g.reader)

    if spec.ablation:
        for name in spec.datasets:
            for m in spec.ablation.methods:
                add(name, m, spec.ablation.k, spec.ablation.branching, spec.ablation.questions or spec.questions,
                    "ablation")
    for g in spec.grids:
        if g.reader:
            grid(g)
    with_reader = list(points)
    for g in spec.grids:
        if not g.reader:
            grid(g)
    # interleave LLM-bound points (ablation, grids with the reader) with encoder-bound ones
    # (reader-free grids), so a pool of two keeps both kinds moving
    free = [k for k in points if k not in with_reader]
    order = [k for pair in itertools.zip_longest(with_reader, free) for k in pair if k is not None]
    return [points[k] for k in order]


def prepare_datasets(spec: SweepSpec, root: Path = Path(".")) -> dict[str, dict]:
    """Paths of each data set's canonical files (converting raw shared files once)."""
    from canopy_ray.data.convert import convert

    out = {}
    for name, d in spec.datasets.items():
        if d.questions:
            out[name] = {"questions": str(root / d.questions),
                         "corpus": str(root / d.corpus) if d.corpus else None}
        else:
            target = root / spec.work_dir / f"{name}"
            if not ((target / "questions.jsonl").is_file() and (target / "corpus.jsonl").is_file()):
                convert(d.format, root / d.raw, target, n_distractors=d.n_distractors)
            out[name] = {"questions": str(target / "questions.jsonl"), "corpus": str(target / "corpus.jsonl")}
        out[name]["index"] = str(root / d.index) if d.index else None
    return out


def _same_point(path: Path, point: dict) -> bool:
    try:
        stored = json.loads(path.read_text())["point"]
    except (OSError, ValueError, KeyError):
        return False
    strip = lambda p: {k: v for k, v in p.items() if k != "roles"}  # noqa: E731
    return strip(stored) == strip(point)


class PointWorker:
    """A Ray Data callable class: models loaded once per actor, one point per batch row."""

    def __init__(self, cfg_data: dict, datasets: dict, llm_cache: str | None, client_factory=None,
                 threads: int = 1):
        import torch

        from canopy_ray.config import CanopyConfig
        from canopy_ray.eval.runs import Runner

        torch.set_num_threads(max(1, int(threads)))
        self.cfg = CanopyConfig.model_validate(cfg_data)
        if client_factory is not None:
            client = client_factory(self.cfg)
        else:
            from canopy_ray.models.llm import client_from_config

            client = client_from_config(self.cfg.llm)
        if llm_cache:
            from canopy_ray.eval.cache import CachedChatClient

            client = CachedChatClient(client, llm_cache)
        self.runner = Runner(self.cfg, client)
        self.datasets, self._sets, self._indexes = datasets, {}, {}

    def _eval_set(self, p: dict):
        from canopy_ray.eval.runs import load_eval_set

        key = (p["dataset"], p["n"], p["seed"], p["split"], p["setting"])
        if key not in self._sets:
            d = self.datasets[p["dataset"]]
            self._sets[key] = load_eval_set(p["dataset"], d["questions"], d["corpus"], n=p["n"], seed=p["seed"],
                                            setting=p["setting"], split=p["split"])
        return self._sets[key]

    def _index(self, p: dict):
        path = self.datasets[p["dataset"]].get("index")
        if p["setting"] != "open":
            return None
        if not path:
            raise ValueError(f"data set {p['dataset']!r} has no index for the open setting")
        if path not in self._indexes:
            from canopy_ray.index import load_index

            self._indexes[path] = load_index(path, nprobe=self.cfg.retrieval.nprobe)
        return self._indexes[path]

    def run_point(self, p: dict) -> dict:
        method = get_method(p["method"])
        base = self.runner.base_settings()
        settings = method.settings(base, self.cfg.margin, p["flat_m"] or self.cfg.hierarchy.flat_m, k=p["k"],
                                   branching=p["branching"])
        result = self.runner.run(self._eval_set(p), method, settings, p["setting"], index=self._index(p),
                                 reader=p.get("reader", True))
        return {"point": p} | result

    def __call__(self, batch: dict) -> dict:
        out = [json.dumps(self.run_point(json.loads(s))) for s in batch["point"]]
        return {"result": out}


def run_points(points: list[dict], cfg_data: dict, datasets: dict, out_dir: Path, pool: PoolSpec,
               llm_cache: str | None, client_factory=None, on_done: Callable[[dict], None] | None = None) -> int:
    """Run points over an autoscaling Ray Data actor pool; write each point file as it arrives."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.verbose_stats_logs = False
    # One point in flight per actor puts pool utilisation at 100% when every actor is busy;
    # Ray Data's default threshold (175%) assumes queued tasks per actor, so lower it to 100%:
    # grow while all actors are busy and points remain.
    ctx.autoscaling_config = dataclasses.replace(ctx.autoscaling_config, actor_pool_util_upscaling_threshold=1.0)
    ds = ray.data.from_items([{"point": json.dumps(p)} for p in points], override_num_blocks=len(points))
    ds = ds.map_batches(
        PointWorker, batch_size=1, num_cpus=pool.cpus_per_actor,
        compute=ActorPoolStrategy(min_size=min(pool.min_actors, len(points)),
                                  max_size=min(pool.max_actors, len(points)), max_tasks_in_flight_per_actor=1),
        fn_constructor_kwargs={"cfg_data": cfg_data, "datasets": datasets, "llm_cache": llm_cache,
                               "client_factory": client_factory, "threads": max(1, int(pool.cpus_per_actor))})
    n = 0
    for row in ds.iter_rows():
        result = json.loads(row["result"])
        write_json(out_dir / "points" / f"{point_key(result['point'])}.json", result)
        n += 1
        if on_done:
            on_done(result)
    return n


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, root: str | Path = ".", client_factory=None,
              report: bool = True, progress: Callable[[str], None] = print, llm: dict | None = None) -> dict:
    """Run the pending points of ``spec`` (Ray must be initialised) and write the report.

    ``llm`` overrides the config's ``llm`` section (``--llm-url``: an OpenAI-compatible server
    as reader and critic); it is part of the config digest, so such points rerun.

    Returns ``{"points": n, "ran": [...keys], "skipped": [...keys], "wall_s": s}``.
    """
    from canopy_ray.config import load_config

    root, out_dir = Path(root), Path(out_dir)
    cfg = load_config(root / spec.config, **({"llm": llm} if llm else {}))
    cfg_data = cfg.model_dump()
    points = expand(spec, digest(cfg_data, 12))
    out_dir.mkdir(parents=True, exist_ok=True)
    shown = cfg_data | {"models": cfg_data["models"] | {"adapter": portable_path(cfg_data["models"]["adapter"])}}
    write_json(out_dir / "sweep.json", {"spec": spec.model_dump(), "config": shown, "points": len(points)})
    done = [p for p in points if _same_point(out_dir / "points" / f"{point_key(p)}.json", p)]
    pending = [p for p in points if p not in done]
    for p in done:  # roles may have grown since the file was written
        path = out_dir / "points" / f"{point_key(p)}.json"
        stored = json.loads(path.read_text())
        if stored["point"].get("roles") != p["roles"]:
            write_json(path, stored | {"point": p})
    progress(f"{len(points)} points: {len(done)} finished before, {len(pending)} to run")
    t0 = time.perf_counter()
    ran = []
    if pending:
        datasets = prepare_datasets(spec, root)
        cache = str(out_dir / "llm_cache.sqlite") if spec.llm_cache else None

        def done_cb(result):
            ran.append(point_key(result["point"]))
            agg = result["aggregate"]
            progress(f"done {ran[-1]}: f1 {agg['f1']['mean']} answer_recall {agg['answer_recall']['mean']} "
                     f"tokens {agg['tokens']['mean']} ({result['wall_s']:.0f} s)")

        run_points(pending, cfg_data, datasets, out_dir, spec.pool, cache, client_factory, done_cb)
    if report:
        from canopy_ray.eval.report import write_report

        write_report(out_dir)
    return {"points": len(points), "ran": ran, "skipped": [point_key(p) for p in done],
            "wall_s": round(time.perf_counter() - t0, 2)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="canopy sweep",
                                description="Sweep over k and B plus the method ablation, on Ray, resumable.")
    p.add_argument("--spec", default="configs/sweep.yaml", help="sweep YAML (default %(default)s)")
    p.add_argument("--out", default="results/sweep", help="results folder (default %(default)s)")
    p.add_argument("--root", default=".", help="paths in the spec are relative to this (default: cwd)")
    p.add_argument("--questions", type=int, default=None, help="override the sample size")
    p.add_argument("--datasets", default=None, help="comma list: only these data sets of the spec")
    p.add_argument("--max-actors", type=int, default=None, help="override pool.max_actors")
    p.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS or a local instance)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray instance")
    p.add_argument("--no-report", action="store_true", help="skip the table and plots")
    p.add_argument("--llm-url", default=None, metavar="URL",
                   help="an OpenAI-compatible server (base URL ending in /v1) as reader and critic, "
                        "instead of the config's LLM")
    p.add_argument("--llm-model", default=None, metavar="M",
                   help="the served model's name (default: the first one the server lists)")
    return p


def main(argv=None) -> int:
    import os

    import ray

    from canopy_ray.config import ConfigError
    from canopy_ray.models.llm.endpoint import llm_override

    args = build_parser().parse_args(argv)
    try:
        llm = llm_override(args.llm_url, args.llm_model).get("llm")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    overrides = {"questions": args.questions}
    if args.max_actors:
        overrides["pool"] = {"max_actors": args.max_actors}
    spec = load_spec(os.path.join(args.root, args.spec) if not os.path.isabs(args.spec) else args.spec, **overrides)
    if args.datasets:
        keep = args.datasets.split(",")
        unknown = set(keep) - set(spec.datasets)
        if unknown:
            print(f"error: unknown data sets {sorted(unknown)}", file=sys.stderr)
            return 2
        spec = spec.model_copy(update={"datasets": {k: v for k, v in spec.datasets.items() if k in keep}})
    started = False
    if not ray.is_initialized():
        address = args.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address)
        else:
            cpus = args.num_cpus or int(max(1, spec.pool.max_actors * spec.pool.cpus_per_actor))
            ray.init(num_cpus=cpus, include_dashboard=False)
        started = True
    try:
        summary = run_sweep(spec, args.out, root=args.root, report=not args.no_report, llm=llm)
    finally:
        if started:
            ray.shutdown()
    print(f"{summary['points']} points: ran {len(summary['ran'])}, skipped {len(summary['skipped'])} "
          f"({summary['wall_s']:.0f} s); results in {args.out}")
    return 0
