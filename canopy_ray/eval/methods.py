"""The compared methods, each a set of pipeline settings over the same CANOPY code.

| method | rounds | compression (:class:`~canopy_ray.core.policy.Policy`) | node encoder |
|---|---|---|---|
| ``shipped`` | R (config) | the configured ``refinement.policy`` | f_theta (config's adapter) |
| ``canopy`` | R | Algorithm 1 (``canopy margin=M``, the config's calibrated margin) | f_theta |
| ``vanilla`` | 1 | none (``whole``) | - |
| ``no_projection`` | R | none (``whole``) | - |
| ``no_iteration`` | 1 | the configured policy | f_theta |
| ``flat`` | R | top-m leaves per item (``flat top=M``, the policy's terms) | f_theta |
| ``frozen`` | R | the configured policy | f0 (adapter off) |
| ``random`` | shipped's | random leaves up to shipped's tokens per item | - |
| ``flat_matched`` | shipped's | best leaves by f_theta up to shipped's tokens per item | f_theta |
| ``random_total`` | shipped's | random leaves of any item up to shipped's tokens per question | - |

Without an adapter in the config, f_theta is f0 and ``frozen`` equals ``shipped``; runs record
the node encoder's ``adapter_id`` so a report can say so.

The *matched-budget* methods (:mod:`canopy_ray.eval.matched`) replay a ``shipped`` run of the
same questions and settings: the same queries and retrieved items per round, each item given
exactly the tokens it kept of it, so they differ from it only in which parts of an item they
keep; ``random_total`` gets only each round's total, so it also draws which items to keep.
Their critic is not asked (its decisions are the replayed run's); the reader is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from canopy_ray.core.policy import Policy
from canopy_ray.core.scoring import Terms
from canopy_ray.pipeline import Settings

COMPRESSIONS = ("shipped", "canopy", "whole", "flat")


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    overrides: dict = field(default_factory=dict)  # Settings fields fixed by the method
    compression: str = "shipped"  # one of COMPRESSIONS: how its policy follows from the config's
    frozen: bool = False  # node encoder f0 instead of f_theta
    matched: str | None = None  # a kind of canopy_ray.eval.matched: replay shipped at its token budget

    @property
    def uses_branching(self) -> bool:
        """Whether B can change the outcome (items passed whole ignore the hierarchy)."""
        return self.compression != "whole"

    def policy(self, configured: Policy, margin: float, flat_m: int) -> Policy:
        """The method's policy, given the configured one, Algorithm 1's margin and the flat m."""
        if self.compression == "canopy":
            return Policy("canopy", margin=margin)
        if self.compression == "whole":
            return Policy("whole")
        if self.compression == "flat":
            return Policy("flat", top=flat_m, terms=configured.terms if configured.ranked else Terms())
        return configured

    def settings(self, base: Settings, margin: float = 0.0, flat_m: int = 5, **point) -> Settings:
        """``base`` with the point's values (k, branching...), then the method's policy and values."""
        values = {k: v for k, v in point.items() if v is not None} | self.overrides
        return dataclasses.replace(base, **values, policy=self.policy(base.policy, margin, flat_m))


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("shipped", "iterative retrieval with the configured policy (the full method)"),
    Method("canopy", "iterative retrieval with Algorithm 1 per item (the paper's refinement)", compression="canopy"),
    Method("vanilla", "one round, items passed whole", {"rounds": 1}, compression="whole"),
    Method("no_projection", "the rounds, items passed whole", compression="whole"),
    Method("no_iteration", "one round with the configured policy", {"rounds": 1}),
    Method("flat", "the rounds, the m best leaves per item", compression="flat"),
    Method("frozen", "the configured policy with f0 as node encoder (adapter off)", frozen=True),
    Method("random", "shipped's items, random leaves up to its tokens per item", matched="random"),
    Method("flat_matched", "shipped's items, best leaves by f_theta up to its tokens per item", matched="flat"),
    Method("random_total", "shipped's rounds, random leaves of any item up to its tokens per question",
           matched="random_total"),
]}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; expected one of {', '.join(METHODS)}") from None


def parse_methods(spec: str | list[str]) -> list[Method]:
    """``"all"``, ``"canopy,vanilla"`` or a list of names -> methods, in the given order."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    if names == ["all"]:
        names = list(METHODS)
    return [get_method(n.strip()) for n in names if n.strip()]
