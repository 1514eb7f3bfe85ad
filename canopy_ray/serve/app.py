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

    s = cfg.serve
    query_encoder = QueryEncoder.options(**_options(cfg, s.query_encoder_limits)).bind(cfg)
    node_encoder = NodeEncoder.options(**_options(cfg, s.node_encoder_limits)).bind(cfg)
    refiner = Refiner.options(**_options(cfg, s.refiner_limits)).bind(cfg, node_encoder)
    searchers = None
    if s.index_dir and s.shard_replicas:  # one replica holds one shard
        from canopy_ray.index.manifest import read_manifest

        n = len(read_manifest(s.index_dir)["shards"])
        searchers = [ShardSearcher.options(name=f"ShardSearcher{i}", **_options(cfg, s.retriever_limits))
                     .bind(s.index_dir, i) for i in range(n)]
    retriever = Retriever.options(**_options(cfg, s.retriever_limits)).bind(s.index_dir, searchers)
    llm = LLMServer.options(**_options(cfg, s.llm_limits)).bind(cfg) if cfg.llm.backend == "local" else None
    return Ingress.options(**_options(cfg, s.ingress_limits)).bind(cfg, query_encoder, refiner, retriever, llm)


def _options(cfg: CanopyConfig, limits: tuple[int, int]) -> dict:
    """A deployment's resources, bounded queue and health checks from ``cfg.serve``. A call past
    ``max_ongoing_requests`` on every replica waits in its caller's queue; past
    ``max_queued_requests`` too, Serve raises ``BackPressureError`` at once (the ingress answers
    JSON) or, for the Ingress itself, its proxy answers ``overload_status`` as text/plain, both
    with ``Retry-After``. A Serve config file's ``deployments:`` entry overrides these."""
    from ray.serve.config import BackpressureConfig

    s = cfg.serve
    return dict(ray_actor_options={"num_cpus": s.replica_cpus}, max_ongoing_requests=limits[0],
                max_queued_requests=limits[1], health_check_period_s=s.health_check_period_s,
                health_check_timeout_s=s.health_check_timeout_s,
                backpressure_config=BackpressureConfig(status_code=s.overload_status, retry_after_s=s.retry_after_s))
