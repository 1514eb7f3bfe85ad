"""Session-wide fixtures: the real packaged MiniLM, loaded once."""

import pytest


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
