"""Per-row reward routing: a row's ``data_source`` picks its reward function, and the row's
reward-info fields (``data_source``, ``extra_info``, ...) reach it as keyword arguments, as
verl's reward functions expect.

``GroundTruth`` is the answer of one prompt row carrying that row's reward info. The data loader
hands it out as ``row["answer"]``, so every caller that passes ``row["answer"]`` to the scorer
(sampling, validation, evaluation) passes the info too, without knowing the fields; the scorer
unpacks it and gives reward functions the plain answer text.

In a table of ``{data_source: function}`` (:class:`SourceTable`) a key ending in ``*`` covers every
data_source that starts with the rest (``aime*``: ``aime2024``, ``aime_2025``, ...); a source's own
key wins over such a prefix, and a longer prefix over a shorter one.

``RewardRouter`` is a reward function itself (picklable: its functions travel as
``"module:function"`` paths and are imported where it runs), so the worker-process pool and
serial scoring treat it like any other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vcppo.rewards.loading import RewardFn, load_reward_fn

BUILTIN_REWARD = "vcppo.rewards.verifier:score"


class GroundTruth(str):
    """A ground-truth answer (it is the answer text) with its row's ``reward_info`` dict."""

    reward_info: dict

    def __new__(cls, answer: str, reward_info: dict | None = None):
        truth = super().__new__(cls, answer)
        truth.reward_info = dict(reward_info or {})
        return truth

    def __reduce__(self):
        return GroundTruth, (str(self), self.reward_info)


def split_ground_truth(truth: Any) -> tuple[Any, dict]:
    """(the plain answer, its row's reward info): what a reward function is called with."""
    if isinstance(truth, GroundTruth):
        return str(truth), dict(truth.reward_info)
    return truth, {}


def data_source_of(truth: Any) -> Any:
    """The ``data_source`` a row's ground truth carries (None without one)."""
    return split_ground_truth(truth)[1].get("data_source")


class SourceTable(dict):
    """``{data_source: function}`` whose keys may end in ``*`` (a prefix; module docstring):
    ``source in table`` and :meth:`key_for` follow that rule."""

    def key_for(self, data_source: Any) -> str | None:
        """The key that covers ``data_source``, or None."""
        if not isinstance(data_source, str):
            return None
        if dict.__contains__(self, data_source):
            return data_source
        prefixes = [k for k in self if k.endswith("*") and data_source.startswith(k[:-1])]
        return max(prefixes, key=len) if prefixes else None

    def __contains__(self, data_source: Any) -> bool:
        return self.key_for(data_source) is not None


@dataclass
class RewardRouter:
    """``fn(response_text, ground_truth, **info)`` that calls ``by_source[info["data_source"]]``, or
    ``default`` (None: the built-in verifier, given ``correct`` / ``wrong``) for other sources;
    ``by_source`` keys may end in ``*`` (:class:`SourceTable`)."""

    by_source: dict[str, RewardFn | str]
    default: RewardFn | str | None = None
    correct: float = 1.0
    wrong: float = -1.0
    _loaded: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.by_source = SourceTable(self.by_source)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_loaded"}  # workers import for themselves

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _loaded={})

    def _load(self, spec: RewardFn | str | None) -> RewardFn:
        spec = BUILTIN_REWARD if spec is None else spec
        if not isinstance(spec, str):
            return spec
        if spec not in self._loaded:
            self._loaded[spec] = load_reward_fn(spec)
        return self._loaded[spec]

    def load_all(self) -> None:
        """Import every function now, so a bad path fails at start-up rather than at the first sample."""
        for spec in [*self.by_source.values(), self.default]:
            self._load(spec)

    def spec_for(self, data_source: Any) -> RewardFn | str | None:
        key = self.by_source.key_for(data_source)
        return self.default if key is None else self.by_source[key]

    def __call__(self, response_text: str, ground_truth: Any, **info: Any) -> float:
        spec = self.spec_for(info.get("data_source"))
        if spec is None or spec == BUILTIN_REWARD:  # the verifier's scores are the configured ones
            info.update(correct=self.correct, wrong=self.wrong)
        return self._load(spec)(response_text, ground_truth, **info)
