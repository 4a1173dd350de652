"""``critic.freeze`` applied: ``requires_grad_(False)`` on the parameters its specs name
(:mod:`vcppo.config.freeze_spec`), before the optimizer is built, so frozen parameters get no gradient
and no optimizer state (LoRA adapters inside a frozen module too)."""
from __future__ import annotations

from vcppo.config.freeze_spec import matches, unmatched


def freeze(module, specs: list[str]) -> set[str]:
    """Set ``requires_grad=False`` on every parameter of ``module`` a spec matches; the frozen names.
    ValueError naming the spec that matches nothing."""
    named = list(module.named_parameters())
    problem = unmatched(list(specs), [n for n, _ in named])
    if problem:
        raise ValueError(problem)
    frozen = {n for n, _ in named if any(matches(s, n) for s in specs)}
    for n, p in named:
        if n in frozen:
            p.requires_grad_(False)
    return frozen
