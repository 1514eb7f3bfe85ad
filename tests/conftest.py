"""Session-wide fixtures: the real packaged MiniLM, loaded once."""

import pytest


@pytest.fixture(scope="session")
def minilm():
    from canopy_ray.models.encoder import TextEncoder

    return TextEncoder()
