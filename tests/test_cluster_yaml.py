"""cluster.yaml against the Ray cluster launcher's own schema (no cloud call)."""

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def _validate(config):
    """What `ray up` does before any cloud call: merge the provider defaults, then check the schema."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(config)))


def test_cluster_yaml_matches_the_launcher_schema(cluster):
    _validate(cluster)


@pytest.mark.parametrize("path,value", [(("available_node_types", "gpu_embed", "max_workers"), "many"),
                                        (("head_node_type",), 3), (("surprise",), True)])
def test_the_schema_check_is_real(cluster, path, value):
    broken = copy.deepcopy(cluster)
    target = broken
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(Exception):
        _validate(broken)


def test_node_types_and_bounds(cluster):
    types = cluster["available_node_types"]
    assert cluster["head_node_type"] == "head" and "GPU" not in types["head"]["resources"]
    for name in ("gpu_embed", "gpu_train", "gpu_llm"):
        assert types[name]["resources"]["GPU"] >= 1
        assert 0 <= types[name]["min_workers"] <= types[name]["max_workers"]
    assert sum(t["max_workers"] for n, t in types.items() if n != "head") <= cluster["max_workers"]


def test_setup_installs_the_gpu_extra_and_the_dashboard_stays_local(cluster):
    assert any("[gpu]" in c for c in cluster["setup_commands"])
    assert all("0.0.0.0" not in c for c in cluster["head_start_ray_commands"])
    assert any("--dashboard-host=127.0.0.1" in c for c in cluster["head_start_ray_commands"])


def test_every_node_requires_the_token_that_ray_up_mounts(cluster):
    starts = [c for c in cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"] if " start " in c]
    assert len(starts) == 2 and all(c.startswith("RAY_AUTH_MODE=token ") for c in starts)
    assert cluster["file_mounts"]["/home/ubuntu/.ray/auth_token"] == "~/.ray/auth_token"
