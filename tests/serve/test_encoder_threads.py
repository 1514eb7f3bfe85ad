import os

import torch

from canopy_ray.serve.deployments import encoder_threads


def test_an_encoder_replica_takes_the_configured_threads_or_every_cpu():
    """Ray gives a replica of under one CPU one thread (OMP_NUM_THREADS=1); the encoders set theirs."""
    before = torch.get_num_threads()
    try:
        assert encoder_threads(1) == torch.get_num_threads() == 1
        assert encoder_threads(None) == len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)
