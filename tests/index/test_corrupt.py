"""Corrupt state: a torn manifest, a shard that fails its checksum, a truncated node
store and an index built for another adapter each fail at load with an error that names the
file and the command that rebuilds the index; that command, run as printed, rebuilds it.

Each test damages a copy of the session's index (``conftest.built_index``) with real file
operations, loads it the ways the Serve deployments do (``Retriever``: ``load_index(verify=
True)``; ``Refiner``: ``load_index(verify=False)``; ``ShardSearcher``: ``load_shard``), then
runs the printed command through ``canopy``'s own entry point.
"""

import shlex
import shutil

import pytest

from canopy_ray.cli import main as canopy
from canopy_ray.config import load_config
from canopy_ray.core.errors import CorruptFileError, IndexMismatchError
from canopy_ray.index import load_index, load_shard
from canopy_ray.index.job import _read_plan
from canopy_ray.index.manifest import CONFIG
from tests.index.conftest import CORPUS

pytestmark = pytest.mark.integration


@pytest.fixture()
def index_copy(built_index, tmp_path):
    src, _ = built_index
    dst = tmp_path / "index"
    shutil.copytree(src, dst)
    return dst


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def assert_names_file_and_rebuilds(err: CorruptFileError, path, root, ref_root) -> None:
    """The message names ``path`` and a command; running it gives back the reference index."""
    msg = str(err)
    assert msg.startswith(str(path) + ":") and err.path == str(path)
    argv = shlex.split(err.rebuild)
    assert f"rebuild it with: {err.rebuild}" in msg
    assert argv[:2] == ["canopy", "index"] and "--overwrite" not in argv
    assert argv[argv.index("--config") + 1] == str(root / CONFIG)
    assert argv[argv.index("--corpus") + 1] == str(CORPUS) and argv[argv.index("--out") + 1] == str(root)
    assert canopy(argv[1:]) == 0  # `canopy index ...` as printed: rebuilt from the job's finished parts
    got, ref = load_index(root), load_index(ref_root)
    assert got.ids == ref.ids and got.manifest["checksum"] == ref.manifest["checksum"]


def test_torn_manifest(built_index, index_copy):
    path = index_copy / "manifest.json"
    truncate(path)
    for load in (lambda: load_index(index_copy), lambda: load_index(index_copy, verify=False),
                 lambda: load_shard(index_copy, 0)):
        with pytest.raises(CorruptFileError, match="torn or truncated") as e:
            load()
    assert_names_file_and_rebuilds(e.value, path, index_copy, built_index[0])


def test_shard_that_fails_its_checksum(built_index, index_copy):
    path = index_copy / "shard-001.faiss"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside a stored vector: same size, still readable
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="does not match its manifest checksum") as e:
        load_shard(index_copy, 1)
    with pytest.raises(CorruptFileError, match="does not match its manifest checksum") as e:
        load_index(index_copy)
    assert_names_file_and_rebuilds(e.value, path, index_copy, built_index[0])


def test_truncated_shard_without_verification(built_index, index_copy):
    """The Refiner loads without checksums: a truncated shard still fails, naming the file."""
    path = index_copy / "shard-002.faiss"
    truncate(path, 0.7)
    with pytest.raises(CorruptFileError, match="not a readable FAISS index") as e:
        load_index(index_copy, verify=False)
    assert_names_file_and_rebuilds(e.value, path, index_copy, built_index[0])


@pytest.mark.parametrize("name, problem", [("nodes.f16.npy", "truncated or changed"),
                                           ("node_spans.npy", "truncated or changed"),
                                           ("node_items.parquet", "not a readable node table")])
def test_truncated_node_store(built_index, index_copy, name, problem):
    path = index_copy / name
    truncate(path)
    for verify in (False, True):
        with pytest.raises(CorruptFileError, match=problem) as e:
            load_index(index_copy, verify=verify)
    assert_names_file_and_rebuilds(e.value, path, index_copy, built_index[0])


def test_truncated_item_table(built_index, index_copy):
    path = index_copy / "items.parquet"
    truncate(path, 0.9)
    with pytest.raises(CorruptFileError, match="checksum"):
        load_index(index_copy)
    with pytest.raises(CorruptFileError, match="not a readable item table") as e:
        load_index(index_copy, verify=False)
    assert_names_file_and_rebuilds(e.value, path, index_copy, built_index[0])


def test_adapter_that_does_not_match_the_manifest(built_index):
    """The session's index was built with f0 (no adapter); the CPU config's node encoder is the
    shipped LoRA adapter, whose vectors the node store does not hold."""
    root, _ = built_index
    tuned = load_config("configs/cpu.yaml")
    with pytest.raises(IndexMismatchError) as e:
        load_index(root, expect=tuned)
    msg = str(e.value)
    assert msg.startswith(str(root / "manifest.json") + ":")
    assert "adapter 'frozen'" in msg and "'lora-" in msg and str(root / CONFIG) in msg
    argv = shlex.split(e.value.rebuild)
    assert argv[:4] == ["canopy", "index", "--config", "CONFIG"] and argv[-1] == "--overwrite"
    assert argv[argv.index("--corpus") + 1] == str(CORPUS)
    # the config it was built with loads it; so does a tuned config when the adapter matches
    assert load_index(root, expect=load_config(root / CONFIG)).count == 13
    other_model = load_config(None, models={"encoder": "qwen3-vl"})
    with pytest.raises(IndexMismatchError, match="base model 'all-MiniLM-L6-v2'"):
        load_index(root, expect=other_model)


def test_damaged_plan_starts_the_job_over(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"corpus": ["a.jsonl"], "shard_rows": [4, 4], "shard_keys": ["a", "b"')
    assert _read_plan(plan) is None and _read_plan(tmp_path / "none.json") is None
    plan.write_text('{"corpus": ["a.jsonl"], "shard_rows": [4, 4]}')  # an earlier version's: parts unnamed
    assert _read_plan(plan) is None
    plan.write_text('{"corpus": ["a.jsonl"], "shard_rows": [4, 4], "shard_keys": ["a", "b"]}')
    assert _read_plan(plan)["shard_rows"] == [4, 4]
