"""Training the node encoder f_theta (CANOPY section 3) with Ray Train.

- :mod:`canopy_ray.train.instances`: (q, v) instances and their preference pairs;
- :mod:`canopy_ray.train.loss`: the pairwise preference loss;
- :mod:`canopy_ray.train.lora`: LoRA on the encoder, adapter and checkpoint files;
- :mod:`canopy_ray.train.cached`: frozen bottom-layer states computed once;
- :mod:`canopy_ray.train.prepare`: what the workers get (f0 queries, cached states, rows);
- :mod:`canopy_ray.train.loop`: the per-worker Ray Train loop (resumable);
- :mod:`canopy_ray.train.validation`: checkpoints chosen on validation without losing recall;
- :mod:`canopy_ray.train.qwen`: the same loop for Qwen3-VL-Embedding (GPU recipe);
- :mod:`canopy_ray.train.fit`: one Ray Train run (:func:`~canopy_ray.train.fit.train`), resumable;
- :mod:`canopy_ray.train.compare`: short recipes compared on validation.

The verb over them is :mod:`canopy_ray.trainer` (``canopy train``).
"""
