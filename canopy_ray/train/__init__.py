"""Training the node encoder f_theta (CANOPY section 3) with Ray Train.

- :mod:`canopy_ray.train.instances`: (q, v) instances and pairs from gold items, the
  deterministic question split, conversion of the shared sets;
- :mod:`canopy_ray.train.loss`: the pairwise preference loss;
- :mod:`canopy_ray.train.lora`: LoRA on the encoder, adapter and checkpoint files;
- :mod:`canopy_ray.train.loop`: the per-worker Ray Train loop (resumable).

The verb is :func:`canopy_ray.trainer.train`.
"""

from canopy_ray.train.instances import (SHARED_SETS, SPLITS, GoldItem, Instance, build_instances,
                                        gold_items, instances_for, load_dataset, prepare_shared,
                                        split_of)
from canopy_ray.train.loss import batch_loss, instance_loss

__all__ = ["SHARED_SETS", "SPLITS", "GoldItem", "Instance", "batch_loss", "build_instances",
           "gold_items", "instance_loss", "instances_for", "load_dataset", "prepare_shared",
           "split_of"]
