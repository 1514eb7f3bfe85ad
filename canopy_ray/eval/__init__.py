"""Evaluation.

- :mod:`canopy_ray.eval.refinement`: refinement quality of f0 vs f_theta on the gold items
  of held-out questions, without an LLM (decision accuracy, gold recall, pruned share, kept
  shares of words and tokens, all by tree depth too); entry ``jobs/eval_refinement.py``.

Submodules are imported explicitly (``from canopy_ray.eval.refinement import run``) so
that importing the package stays cheap.
"""
