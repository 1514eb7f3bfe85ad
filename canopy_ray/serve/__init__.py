"""Ray Serve: the CANOPY deployment graph and its HTTP API (see :func:`build_app`)."""

from canopy_ray.serve.app import build_app

__all__ = ["build_app"]
