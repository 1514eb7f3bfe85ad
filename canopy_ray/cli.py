"""The ``canopy`` command: one registry of verbs over the package's functions.

Verbs whose options are shared with a ``jobs/*.py`` entry point own their parser: the
registry names the module whose ``main(argv)`` takes the rest of the command line. The
others (quickstart, demo, compress, serve) are parsed here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from importlib import resources
from pathlib import Path

from canopy_ray.config import ConfigError, load_config


# verb -> (module with main(argv), help)
PASS_THROUGH = {
    "index": ("canopy_ray.indexer", "index a corpus with the Ray Data job (FAISS shards + node store)"),
    "train": ("canopy_ray.trainer", "fine-tune the node encoder f_theta (LoRA) with Ray Train; resumable"),
    "eval": ("canopy_ray.evaluator", "run methods over a question set; one JSON with intervals per run"),
    "eval-refinement": ("canopy_ray.eval.refinement", "f0 vs f_theta refinement on gold items (no LLM)"),
    "sweep": ("canopy_ray.eval.sweep", "the resumable k x B sweep on an autoscaling Ray actor pool"),
    "report": ("canopy_ray.eval.report", "turn a results folder into a markdown table and PNG plots"),
    "calibrate": ("canopy_ray.eval.calibrate", "choose the refinement margin on validation for a recall target"),
    "compact": ("canopy_ray.train.compact", "truncate a LoRA adapter's updates to a lower rank (SVD), in fp16"),
}


# The path options of the verbs that read data and write results: (inputs, outputs).
DATA_PATHS = {
    "index": (("corpus", "media_root"), ("out",)),
    "train": (("shared_data",), ("work_dir", "storage", "out", "cache_dir")),
}


def ray_job_copy() -> Path | None:
    """Ray's copy of the project when this runs as a job submitted with ``--working-dir``
    (the job's working directory), else None. The job supervisor hands the job its runtime
    env in ``RAY_JOB_CONFIG_JSON_ENV_VAR``."""
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    return Path.cwd() if (job.get("runtime_env") or {}).get("working_dir") else None


def job_path_problem(verb: str, argv: list[str]) -> str | None:
    """In Ray's copy of the working directory a relative path means a place inside that copy:
    a data path there finds nothing of the submitter's, and results written there stay in a
    temporary directory on one node. Such a path is refused, naming it and the fix."""
    copy = ray_job_copy()
    if copy is None or verb not in DATA_PATHS:
        return None
    args, _ = importlib.import_module(PASS_THROUGH[verb][0]).build_parser().parse_known_args(argv)
    inputs, outputs = DATA_PATHS[verb]
    if verb == "train" and all((Path(args.work_dir) / s / "questions.jsonl").is_file() for s in args.sets):
        inputs = ()  # every set is converted already: the raw data is not read
    for name in inputs + outputs:
        value = getattr(args, name)
        if value is None or Path(value).is_absolute() or (name in inputs and Path(value).exists()):
            continue
        flag = "--" + name.replace("_", "-")
        what = "no such path there" if name in inputs else "what is written there is lost with the copy"
        return (f"{flag} {value} is relative, and this job runs in Ray's copy of the working directory "
                f"({copy}): {what}. Pass an absolute path on a file system every node mounts, "
                f'e.g. {flag} "$PWD/{value}" from the directory you submit from')
    return None


def _examples() -> list[dict]:
    path = resources.files("canopy_ray") / "assets" / "examples" / "demo.json"
    return json.loads(path.read_text())["examples"]


def _compressor(config: str | None):
    from canopy_ray.compressor import Compressor
    from canopy_ray.models.encoder import build_encoder

    from canopy_ray.models.llm.tokens import token_counter

    cfg = load_config(config)
    return Compressor.from_config(cfg, build_encoder(cfg.models), count_tokens=token_counter(cfg.llm))


def _print_results(query: str, results) -> None:
    from canopy_ray.compressor import format_forest

    print(f"\nQ: {query}")
    for r in results:
        print(format_forest(r))
    before = sum(r.tokens_before for r in results)
    after = sum(r.tokens_after for r in results)
    print(f"total: {before} -> {after} tokens ({1 - after / max(before, 1):.0%} fewer)")


def cmd_demo(args) -> int:
    from canopy_ray.core.items import parse_item

    comp = _compressor(args.config)
    for ex in _examples():
        _print_results(ex["query"], comp.compress(ex["query"], [parse_item(i) for i in ex["items"]]))
        print(f"gold answer: {', '.join(ex['answers'])}")
    return 0


def cmd_compress(args) -> int:
    from canopy_ray.core.items import ItemError, iter_jsonl

    lines = Path(args.items).read_text().splitlines()
    items = []
    for lineno, item in iter_jsonl(lines):
        if isinstance(item, ItemError):
            print(f"skipped line {lineno}: {item}", file=sys.stderr)
        else:
            items.append(item)
    if not items:
        print("no valid items", file=sys.stderr)
        return 2
    from canopy_ray.core.policy import PolicyError, resolved

    comp = _compressor(args.config)
    try:  # an auto margin is the config's calibrated one
        policy = resolved(args.policy, lambda: load_config(args.config).margin) if args.policy else None
    except PolicyError as e:
        print(f"error: --policy: {e}", file=sys.stderr)
        return 2
    results = comp.compress(args.query, items, branching=args.branching, policy=policy)
    if args.json:
        print(json.dumps([r.to_dict(explain=True) for r in results], indent=1))
    else:
        _print_results(args.query, results)
    return 0


def cmd_serve(args) -> int:
    import ray
    from ray import serve

    from canopy_ray.serve import build_app

    over = {k: v for k, v in {"index_dir": args.index, "media_root": args.media_root, "host": args.host,
                              "port": args.port}.items() if v is not None}
    cfg = load_config(args.config, serve=over)
    ray.init(address=args.address, include_dashboard=False)
    serve.start(http_options={"host": cfg.serve.host, "port": cfg.serve.port})
    serve.run(build_app({"cfg": cfg}), name="canopy", route_prefix="/", blocking=True)
    return 0


def cmd_quickstart(args) -> int:
    from canopy_ray.quickstart import reader_override, run

    if args.llm_model and not args.llm_url:
        raise ConfigError("--llm-model needs --llm-url (the OpenAI-compatible server that serves it)")
    llm = {"llm": reader_override(args.llm_url, args.llm_model)} if args.llm_url else {}
    run(load_config(args.config, **llm), args.out, args.questions, port=args.port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="canopy", description="CANOPY evidence compression for multimodal RAG, on Ray")
    sub = p.add_subparsers(dest="command", required=True)

    qs = sub.add_parser("quickstart", help="index the bundled sample, serve it, ask it, show the evidence forests")
    qs.add_argument("--config", default=None, help="YAML config (default: the CPU defaults)")
    qs.add_argument("--out", default="runs/quickstart", help="index, answers.json and report.html go here")
    qs.add_argument("--questions", type=int, default=4, help="sample questions to ask")
    qs.add_argument("--port", type=int, default=8000)
    qs.add_argument("--llm-url", default=None, metavar="URL",
                    help="an OpenAI-compatible server (base URL ending in /v1) as reader and critic, "
                         "instead of the CPU default SmolLM2-135M")
    qs.add_argument("--llm-model", default=None, metavar="M",
                    help="the served model's name (default: the first one the server lists)")
    qs.set_defaults(func=cmd_quickstart)

    demo = sub.add_parser("demo", help="compress the bundled examples and print the evidence forests")
    demo.add_argument("--config", default=None, help="YAML config (default: built-in CPU defaults)")
    demo.set_defaults(func=cmd_demo)

    comp = sub.add_parser("compress", help="compress the items of a JSONL file for one query")
    comp.add_argument("--query", required=True)
    comp.add_argument("--items", required=True, help="canonical items, one JSON object per line")
    comp.add_argument("--config", default=None)
    comp.add_argument("--branching", type=int, default=None, help="override B")
    comp.add_argument("--policy", default=None, help="override refinement.policy, e.g. 'canopy margin=0.05'")
    comp.add_argument("--json", action="store_true", help="print JSON instead of trees")
    comp.set_defaults(func=cmd_compress)

    srv = sub.add_parser("serve", help="run the Ray Serve application (HTTP API on 127.0.0.1:8000)")
    srv.add_argument("--config", default="configs/cpu.yaml")
    srv.add_argument("--index", default=None, help="index directory for /v1/answer")
    srv.add_argument("--media-root", default=None, help="image/video paths in requests must lie under it")
    srv.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=None)
    srv.add_argument("--address", default=None, help="Ray cluster address (default: start a local one)")
    srv.set_defaults(func=cmd_serve)

    data = sub.add_parser("data", help="data set tools").add_subparsers(dest="data_command", required=True)
    # listed for --help; main() hands their arguments to their own parsers
    data.add_parser("convert", help="convert HotpotQA / NQ / TAT-QA into corpus.jsonl + questions.jsonl")
    for name, (_, help_text) in PASS_THROUGH.items():
        sub.add_parser(name, help=help_text)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # These verbs own their argument parsers (shared with jobs/*.py); hand them the rest.
    if argv[:2] == ["data", "convert"]:
        return importlib.import_module("canopy_ray.data.convert").main(argv[2:])
    if argv[:1] and argv[0] in PASS_THROUGH:
        if problem := job_path_problem(argv[0], argv[1:]):
            print(f"error: {problem}", file=sys.stderr)
            return 2
        return importlib.import_module(PASS_THROUGH[argv[0]][0]).main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"canopy: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
