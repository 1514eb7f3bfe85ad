"""The compared methods, each a set of pipeline settings over the same CANOPY code.

| method | rounds | compression | node encoder |
|---|---|---|---|
| ``canopy`` | R (config) | refinement (Algorithm 1) | f_theta (config's adapter) |
| ``vanilla`` | 1 | none (items whole) | - |
| ``no_projection`` | R | none (items whole) | - |
| ``no_iteration`` | 1 | refinement | f_theta |
| ``flat`` | R | top-m leaves per item by f_theta | f_theta |
| ``frozen`` | R | refinement | f0 (adapter off) |
| ``random`` | CANOPY's | random leaves up to CANOPY's tokens per item | - |
| ``flat_matched`` | CANOPY's | best leaves by f_theta up to CANOPY's tokens per item | f_theta |
| ``random_total`` | CANOPY's | random leaves of any item up to CANOPY's tokens per question | - |

Without an adapter in the config, f_theta is f0 and ``frozen`` equals ``canopy``; runs record
the node encoder's ``adapter_id`` so a report can say so.

The *matched-budget* methods (:mod:`canopy_ray.eval.matched`) replay a CANOPY run of the
same questions and settings: the same queries and retrieved items per round, each item given
exactly the tokens CANOPY kept of it, so they differ from CANOPY only in which parts of an item
they keep; ``random_total`` gets only each round's total, so it also draws which items to keep.
Their critic is not asked (its decisions are CANOPY's); the reader is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from canopy_ray.pipeline import Settings


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    overrides: dict = field(default_factory=dict)  # Settings fields fixed by the method
    frozen: bool = False  # node encoder f0 instead of f_theta
    matched: str | None = None  # a kind of canopy_ray.eval.matched: replay CANOPY at its token budget

    @property
    def uses_branching(self) -> bool:
        """Whether B can change the outcome (items passed whole ignore the hierarchy)."""
        return self.overrides.get("mode", "canopy") != "none"

    def settings(self, base: Settings, **point) -> Settings:
        """``base`` with the point's values (k, branching, flat_m...) and then the method's."""
        values = base.__dict__ | {k: v for k, v in point.items() if v is not None} | self.overrides
        return Settings(**values)


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("canopy", "iterative retrieval with refinement (the full method)"),
    Method("vanilla", "one round, items passed whole", {"rounds": 1, "mode": "none"}),
    Method("no_projection", "CANOPY's rounds, items passed whole", {"mode": "none"}),
    Method("no_iteration", "one round with refinement", {"rounds": 1}),
    Method("flat", "CANOPY's rounds, the m best leaves per item", {"mode": "flat"}),
    Method("frozen", "CANOPY with f0 as node encoder (adapter off)", {}, frozen=True),
    Method("random", "CANOPY's items, random leaves up to CANOPY's tokens per item", {"mode": "canopy"},
           matched="random"),
    Method("flat_matched", "CANOPY's items, best leaves by f_theta up to CANOPY's tokens per item",
           {"mode": "canopy"}, matched="flat"),
    Method("random_total", "CANOPY's rounds, random leaves of any item up to CANOPY's tokens per question",
           {"mode": "canopy"}, matched="random_total"),
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
