"""The refinement policy: one frozen value with one text form, read where a config or a request
is read and passed down as it is. Every layer below asks the policy, never "which mode?".

| text | asks for | keeps |
|---|---|---|
| ``canopy margin=M`` | each item's root, then the children of every node it splits | Algorithm 1 per item (:mod:`canopy_ray.core.refine`); cosine alone, as the paper |
| ``hybrid share=S cutoff=C z=Z`` | every leaf, then the parents a chosen leaf may rise to | the best S of all the items' leaves ranked together (those within C of the best, and Z standard deviations above the leaves' mean), each raised to its parent while the parent scores >= it; an item with no chosen leaf is left out |
| ``flat share=S`` / ``flat top=M`` | every leaf | the same leaves (or each item's M best), not raised |
| ``whole`` | nothing | every item whole |

The ranking policies (hybrid, flat) add score terms to the cosine
(:class:`canopy_ray.core.scoring.Terms`): ``bm25=W title=W link=W cross=W bridge=W``. So the shipped
default reads ``hybrid share=0.4 cutoff=0.8 bm25=0.4 title=0.1 link=0.2``, the same in
``configs/cpu.yaml``, in a request's ``policy`` field, in a run's spec and in the study's tables.
``margin=auto`` (a config only) is the margin calibrated for the adapter, resolved by the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Generator, Sequence

from canopy_ray.core.hierarchy import Node, Span
from canopy_ray.core.refine import Ask, hybrid, refine, score_hybrid, score_lazily, top_leaves
from canopy_ray.core.scoring import Terms

KINDS = ("canopy", "hybrid", "flat", "whole")
TERMS = tuple(f.name for f in fields(Terms))
# which keys each kind takes, in the order the text form writes them
KEYS = {"canopy": ("margin",), "hybrid": ("share", "cutoff", "z") + TERMS, "flat": ("share", "top", "cutoff", "z") + TERMS,
        "whole": ()}


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Policy:
    kind: str = "canopy"
    margin: float | None = 0.0  # canopy: split only when a child beats the node by this; None: auto
    share: float = 1.0  # hybrid, flat: the share of all the items' leaves ranked together
    top: int | None = None  # flat: each item's m best leaves instead of a share
    cutoff: float | None = None  # hybrid, flat: only the leaves within this of the question's best
    z: float | None = None  # hybrid, flat: only the leaves this many deviations above the leaves' mean score
    terms: Terms = field(default_factory=Terms)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise PolicyError(f"policy must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.margin is not None and not self.margin >= 0:
            raise PolicyError(f"margin must be >= 0, got {self.margin!r}")
        if not 0 < self.share <= 1:
            raise PolicyError(f"share must be in (0, 1], got {self.share!r}")
        if self.top is not None and self.top < 1:
            raise PolicyError(f"top must be >= 1, got {self.top!r}")
        if self.cutoff is not None and not self.cutoff >= 0:
            raise PolicyError(f"cutoff must be >= 0, got {self.cutoff!r}")
        default = Policy.__dataclass_fields__
        for key in ("margin", "share", "top", "cutoff", "z"):
            if key not in KEYS[self.kind] and getattr(self, key) != default[key].default:
                raise PolicyError(f"{self.kind} takes no {key}")
        if self.terms and not self.ranked:
            raise PolicyError(f"{self.kind} scores by cosine alone: it takes no "
                              f"{', '.join(n for n, _ in self.terms.items())}")

    @property
    def ranked(self) -> bool:
        """Whether it ranks every leaf (and so takes score terms)."""
        return self.kind in ("hybrid", "flat")

    @classmethod
    def parse(cls, text: str) -> "Policy":
        """``"hybrid share=0.4 cutoff=0.8 bm25=0.4"`` -> a Policy (unnamed keys keep their defaults)."""
        kind, *pairs = str(text).split()
        if kind not in KINDS:
            raise PolicyError(f"policy must start with one of {', '.join(KINDS)}, got {text!r}")
        args: dict = {}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if eq and key in TERMS and key not in KEYS[kind]:
                raise PolicyError(f"{kind} scores by cosine alone: it takes no {key} (in {text!r})")
            if not eq or key not in KEYS[kind]:
                raise PolicyError(f"{kind} takes {', '.join(k + '=' for k in KEYS[kind]) or 'no keys'}; "
                                  f"got {pair!r} in {text!r}")
            if key in args:
                raise PolicyError(f"{key} given twice in {text!r}")
            try:
                args[key] = (None if value == "auto" and key == "margin" else int(value) if key == "top"
                             else float(value))
            except ValueError:
                raise PolicyError(f"{key} must be a number, got {value!r} in {text!r}") from None
            if isinstance(args[key], float) and not math.isfinite(args[key]):
                raise PolicyError(f"{key} must be finite, got {value!r}")
        try:
            terms = Terms(**{k: args.pop(k) for k in TERMS if k in args})
        except ValueError as e:
            raise PolicyError(str(e)) from None
        return cls(kind, terms=terms, **args)

    def __str__(self) -> str:
        values = {"margin": "auto" if self.margin is None else self.margin, "share": self.share, "top": self.top,
                  "cutoff": self.cutoff, "z": self.z, **dict(self.terms.items())}
        default = Policy.__dataclass_fields__
        # the margin is always written (Algorithm 1's one knob); a flat share of 1 is the default
        shown = [k for k in KEYS[self.kind] if values.get(k) is not None
                 and (k == "margin" or k in TERMS or values[k] != default[k].default
                      or (k == "share" and self.top is None))]
        return " ".join([self.kind] + [f"{k}={values[k]:g}" if not isinstance(values[k], str) else f"{k}={values[k]}"
                                       for k in shown])

    def with_margin(self, margin: float) -> "Policy":
        """The policy with an ``auto`` margin resolved (other policies unchanged)."""
        return replace(self, margin=margin) if self.kind == "canopy" and self.margin is None else self

    def _margin(self) -> float:
        if self.margin is None:
            raise PolicyError("the policy's margin is auto: resolve it (Policy.with_margin) before refining")
        return self.margin

    def asks(self, roots: Sequence[Node]) -> Generator[Ask, Sequence[float], list[dict[Span, float]]]:
        """The nodes it scores, asked for level by level (drive with :func:`canopy_ray.core.refine.drive`)."""
        if self.kind == "canopy":
            return score_lazily(roots, self._margin())
        if self.kind == "hybrid":
            # the link term ranks items by their best leaf, a single-node item's root among them
            return score_hybrid(roots, self.share, singles=bool(self.terms.link), cutoff=self.cutoff, z=self.z)
        return _every_leaf(roots, self.kind == "flat")

    def keep(self, roots: Sequence[Node], scores: Sequence[dict[Span, float]]) -> list[list[Span]]:
        """Kept spans per tree, sorted (``[]``: the item is left out), from the scores :meth:`asks` got."""
        if self.kind == "canopy":
            return [refine(r, sc, self._margin()) for r, sc in zip(roots, scores)]
        if self.kind == "hybrid":
            return hybrid(roots, scores, self.share, cutoff=self.cutoff, z=self.z)
        if self.kind == "whole":
            return [[r.span] for r in roots]
        if self.top is not None:
            return [sorted(sorted((n.span for n, _ in r.walk() if n.is_leaf), key=lambda s: -sc[s])[:self.top])
                    for r, sc in zip(roots, scores)]
        chosen = top_leaves(roots, scores, self.share, self.cutoff, self.z)
        return [sorted(c) if r.children else [r.span] for r, c in zip(roots, chosen)]


def _every_leaf(roots: Sequence[Node], leaves: bool = True):
    """Every leaf of every tree (single-node trees' roots too), in one ask; ``leaves=False``: none."""
    ask = [(i, n) for i, r in enumerate(roots) for n, _ in r.walk() if n.is_leaf and leaves]
    scores: list[dict[Span, float]] = [{} for _ in roots]
    if ask:
        for (i, n), s in zip(ask, (yield ask), strict=True):
            scores[i][n.span] = float(s)
    return scores


def resolved(text: str | Policy, margin) -> Policy:
    """A caller's policy with an ``auto`` margin resolved by ``margin()`` (asked only then)."""
    policy = text if isinstance(text, Policy) else Policy.parse(text)
    return policy.with_margin(margin()) if policy.margin is None else policy
