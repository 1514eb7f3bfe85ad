"""Compose the deployment graph from a config."""

from __future__ import annotations

from typing import Any

from canopy_ray.config import CanopyConfig, load_config


def build_app(args: dict[str, Any] | None = None):
    """The CANOPY Serve application.

    ``args``: ``config`` (a YAML path; default: built-in CPU defaults) plus optional
    ``index_dir``, ``media_root``, ``adapter`` overrides. From Python::

        from ray import serve
        from canopy_ray.serve import build_app
        serve.run(build_app({"config": "configs/cpu.yaml", "index_dir": "runs/index"}))

    From a Serve config file (``serve run configs/serve.yaml``)::

        applications:
          - name: canopy
            import_path: canopy_ray.serve:build_app
            args: {config: configs/cpu.yaml, index_dir: runs/index}
    """
    args = {k: v for k, v in (args or {}).items() if v is not None}  # YAML nulls mean "not given"
    cfg = args.pop("cfg", None) or load_config(args.pop("config", None))
    serve_over = {k: args.pop(k) for k in ("index_dir", "media_root") if k in args}
    models_over = {k: args.pop(k) for k in ("adapter",) if k in args}
    if args:
        raise ValueError(f"unknown build_app args: {sorted(args)}")
    return graph(cfg.override(serve=serve_over, models=models_over))


def graph(cfg: CanopyConfig):
    from canopy_ray.serve.deployments import (LLMServer, NodeEncoder, QueryEncoder, Refiner, Retriever,
                                              ShardSearcher)
    from canopy_ray.serve.ingress import Ingress

    cpus = {"num_cpus": cfg.serve.replica_cpus}
    query_encoder = QueryEncoder.options(ray_actor_options=cpus).bind(cfg)
    node_encoder = NodeEncoder.options(ray_actor_options=cpus).bind(cfg)
    refiner = Refiner.options(ray_actor_options=cpus).bind(cfg, node_encoder)
    searchers = None
    if cfg.serve.index_dir and cfg.serve.shard_replicas:  # one replica holds one shard
        from canopy_ray.index.manifest import read_manifest

        n = len(read_manifest(cfg.serve.index_dir)["shards"])
        searchers = [ShardSearcher.options(name=f"ShardSearcher{s}", ray_actor_options=cpus)
                     .bind(cfg.serve.index_dir, s) for s in range(n)]
    retriever = Retriever.options(ray_actor_options=cpus).bind(cfg.serve.index_dir, searchers)
    llm = LLMServer.options(ray_actor_options=cpus).bind(cfg) if cfg.llm.backend == "local" else None
    return Ingress.options(ray_actor_options=cpus).bind(cfg, query_encoder, refiner, retriever, llm)

