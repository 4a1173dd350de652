"""Custom reward functions by dotted path (``reward.function``): what the trainer and the reward
worker processes (:mod:`vcppo.rewards.pool`) both import."""
from __future__ import annotations

import importlib
from typing import Callable

RewardFn = Callable[..., float]


def load_reward_fn(path: str) -> RewardFn:
    """Import a reward function from ``"pkg.module:function"`` (``"pkg.module.function"`` also works)."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"reward function path must be 'module:function', got {path!r}")
    if ":" in path:
        mod_name, attr = path.split(":", 1)
    elif "." in path:
        mod_name, attr = path.rsplit(".", 1)
    else:
        raise ValueError(f"reward function path must be 'module:function', got {path!r}")
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise ImportError(f"cannot import module {mod_name!r} for reward function {path!r}: {e}") from e
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise AttributeError(f"module {mod_name!r} has no attribute {attr!r} (reward function {path!r})")
        fn = getattr(fn, part)
    if not callable(fn):
        raise TypeError(f"reward function {path!r} is not callable ({type(fn).__name__})")
    return fn
