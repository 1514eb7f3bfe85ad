"""Session-wide fixtures: the real packaged MiniLM, loaded once."""

import os

import pytest

# Ray Train's controller polls its workers every 2 s, and a worker's report with a checkpoint
# waits for that poll: the tests' runs of 0.02 s steps would spend 2 s per checkpoint. Every Ray
# the tests start inherits this environment (a LocalCluster's nodes only what it is given).
os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.25"
os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the tokenizers' threads and a later fork do not mix


@pytest.fixture(autouse=True)
def _torch_threads():
    """Each test leaves torch's thread count as it found it: a Ray Data callable built in the test
    process (the sweep's PointWorker) sets one thread, as its actor should, and would otherwise
    run every later test's models on one core."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def minilm():
    from canopy_ray.models.encoder import TextEncoder

    return TextEncoder()


@pytest.fixture(scope="session")
def ray_local():
    """One private local Ray (2 CPUs) for every integration test of the session."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
