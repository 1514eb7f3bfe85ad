"""Evaluation.

- :mod:`canopy_ray.eval.refinement`: refinement quality of f0 vs f_theta on the gold items
  of held-out questions, without an LLM (decision accuracy, gold recall, pruned share, kept
  shares of words and tokens, all by tree depth too); entry ``jobs/eval_refinement.py``.
- :mod:`~canopy_ray.eval.methods`, :mod:`~canopy_ray.eval.runs`: the ablation methods through one
  pipeline, per-question records and aggregates with bootstrap intervals (``canopy eval``).
- :mod:`~canopy_ray.eval.matched`: the matched-budget baselines (``random``, ``flat_matched``,
  ``random_total``) that replay a CANOPY run at CANOPY's tokens per item (per question).
- :mod:`~canopy_ray.eval.sweep`: the resumable k x B sweep on an autoscaling actor pool (``canopy sweep``).
- :mod:`~canopy_ray.eval.report`: markdown tables and PNG plots of a results folder (``canopy report``).
- :mod:`~canopy_ray.eval.cache`: encoder and LLM-reply caches that make reruns cheap.

Submodules are imported explicitly (``from canopy_ray.eval.refinement import run``) so
that importing the package stays cheap.
"""
