"""Converters from raw benchmark files (HotpotQA, NQ-open, TAT-QA) to the canonical forms.

The API lives in :mod:`canopy_ray.data.convert` (``convert``, ``convert_records``,
``main``), the dispatcher; :mod:`canopy_ray.data.records` holds the helpers every
converter shares (``read_records``, ``Sink``, ``ConvertReport``, ``ConvertError``, ids,
value matching); one module per raw format (``hotpotqa``, ``nq``, ``tatqa``) imports from
``records`` only. :mod:`canopy_ray.data.sets` names the shared benchmark sets and
converts / loads them as canonical directories.
Nothing is imported here, so ``canopy_ray.data.convert`` always names the module and
``python -m canopy_ray.data.convert`` runs it once.
"""
