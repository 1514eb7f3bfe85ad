"""canopy-ray: CANOPY adaptive-granularity evidence compression for multimodal RAG, on Ray."""

from canopy_ray.core.hierarchy import balanced_tree
from canopy_ray.core.refine import refine

__all__ = ["balanced_tree", "refine"]
__version__ = "0.1.0"
