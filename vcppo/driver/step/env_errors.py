"""An env's errors in words, as the reward's are (:class:`~vcppo.rewards.verifier.RewardScorer`):
the first few logged with the env's name, the episode's turn and the message, then one in a
hundred; the step's count and first message for the step's one-line summary; and the text guard
at the tokenizer's door (:func:`readable`).

Two kinds: a *failure* (the env raised, hung, died or answered garbage) ends its episode, scored
wrong, and counts in ``env/failures`` and against ``trainer.max_failed_reward_steps``; a *text
error* (an observation that is not valid Unicode: a lone surrogate, from a JSON escape such as
``"\\ud800"`` the policy wrote, or bytes an env read with ``surrogateescape``) is answered with the
text escaped, which the policy can read, counts in ``env/text_errors``, and the episode goes on.
"""
from __future__ import annotations

import dataclasses
import logging

logger = logging.getLogger(__name__)


def readable(text: str) -> tuple[str, bool]:
    """(``text`` as the tokenizer can encode it, whether it was already): a character UTF-8 cannot
    hold (a lone surrogate) becomes its backslash escape, ``\\ud800``."""
    try:
        text.encode("utf-8")
        return text, True
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8"), False


class EnvErrorLog:
    """The errors of env ``env`` on this rank: :meth:`failed` and :meth:`unreadable` log the first
    ``max_warnings`` of each kind, then every hundredth; :meth:`take_step` gives (and resets) the
    step's first message, for the step's summary line."""

    def __init__(self, env: str, max_warnings: int = 5):
        self.env, self.max_warnings = env, max_warnings
        self.num_failures = self.num_text_errors = 0
        self.step_first: str | None = None

    def _say(self, n: int, what: str) -> None:
        if self.step_first is None:
            self.step_first = what
        if n <= self.max_warnings or n % 100 == 0:
            logger.warning("env %r %s (%d so far)", self.env, what, n)

    def failed(self, turn: int, message: str) -> None:
        """The env failed the episode's ``turn`` (1-based) with ``message``: the episode ends."""
        self.num_failures += 1
        self._say(self.num_failures, f"failed at turn {turn}, the episode ends scored wrong: {message}")

    def unreadable(self, turn: int) -> None:
        """The env's answer to ``turn`` held text that is not valid Unicode."""
        self.num_text_errors += 1
        self._say(self.num_text_errors, f"answered turn {turn} with text that is not valid Unicode (a lone "
                                        "surrogate); the policy reads it escaped (env/text_errors)")

    def take_step(self) -> str | None:
        first, self.step_first = self.step_first, None
        return first


def step_summary(where: str, env: str, metrics: dict, first: str | None) -> str | None:
    """The step's one line on its env errors (None without any): ``metrics`` the step's summed
    episode metrics, ``first`` this rank's first error of the step."""
    failures, text = metrics.get("env/failures", 0.0), metrics.get("env/text_errors", 0.0)
    if not failures and not text:
        return None
    episodes = metrics.get("env/episodes", 0.0)
    parts = [f"{failures:.0f} of {episodes:.0f} episodes ended by env errors"] if failures else []
    parts += [f"{text:.0f} observations not valid Unicode"] if text else []
    return f"{where}: env {env!r}: " + ", ".join(parts) + (f"; first: {first}" if first else "")


def check_replay(envs, episodes: list, env: str) -> bool:
    """Replay one episode's turns on a fresh env (in ``envs``, the worker pool) and say in one line
    if its last answer differs from the run's: an env must be deterministic in (row, seed, actions)
    (:mod:`vcppo.envs.base`), or a resumed run and the pool's replays see other episodes. True once
    an episode was replayed (False: none had an env answer yet, try again later)."""
    done = [e for e in episodes if e.last_answer is not None]
    if not done:
        return False
    e = max(done, key=lambda x: x.last_answer[0])  # the most turns: the most state to differ
    n, had = e.last_answer
    key = dataclasses.replace(e.key, episode=e.key.episode + "/replay", actions=tuple(e.actions[:n - 1]))
    got = envs.step([(e.actions[n - 1], key)])[0]
    fields = lambda t: (t.observation, t.reward, t.terminated, t.truncated)  # noqa: E731
    if isinstance(got, str) or fields(got) != fields(had):
        seen = got if isinstance(got, str) else repr(fields(got))[:200]
        logger.warning("env %r is not deterministic: episode %s replayed on a fresh env answered turn %d with %s, "
                       "the run had %s; a resumed run will not repeat its episodes, nor the worker pool an "
                       "episode another worker began (an env must depend only on the row, the seed and the "
                       "actions: docs/multiturn.md)", env, e.key.episode, n, seen, repr(fields(had))[:200])
    return True
