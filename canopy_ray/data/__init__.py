"""Converters from raw benchmark files (HotpotQA, NQ-open, TAT-QA) to the canonical forms.

The API lives in :mod:`canopy_ray.data.convert` (``convert``, ``convert_records``,
``ConvertReport``, ``main``); one module per raw format (``hotpotqa``, ``nq``, ``tatqa``).
Nothing is imported here, so ``canopy_ray.data.convert`` always names the module and
``python -m canopy_ray.data.convert`` runs it once.
"""
