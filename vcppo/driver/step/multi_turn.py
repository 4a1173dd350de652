"""Multi-turn episodes: prompts -> turns of vLLM samples and environment answers -> a
:class:`~vcppo.experience.Rollout` whose response is the whole episode after the prompt.

Token for token: every model turn is kept exactly as sampled (ids and logprobs); an observation is
tokenized once (:class:`ObservationEncoder`, through the chat template's user or tool turn) and
appended. The conversation is never decoded and re-encoded. A step's live episodes advance
together: one vLLM call per turn (the prefix cache kept between turns), then that turn's env steps
in parallel in the worker pool (:mod:`vcppo.envs.worker`).

The layout: ``responses`` hold model and observation tokens; ``policy_mask`` is 1 on model tokens
(0 on observation tokens and padding), so the policy loss, the KL, the entropy,
the mismatch metrics and the critic's fit read model tokens only, while every forward pass reads
the whole episode (``attention_mask``). A turn's reward sits on its last model token; Decoupled-GAE
steps over the observations (:mod:`vcppo.algos.gae`: masked positions are skipped). The episode's
score is the sum of its turn rewards. Limits: ``rollout.max_turns``, ``rollout.turn_max_tokens``,
``rollout.max_response_tokens`` (model + observation tokens) and the engine's context; an episode
they cut is marked ``truncated`` (an end the env itself declares, terminated or truncated, is the
episode's outcome: its reward is complete).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from vcppo.driver.step.env_errors import EnvErrorLog, check_replay, readable
from vcppo.runtime import collectives
from vcppo.envs.base import BUILTIN, Turn
from vcppo.envs.worker import EnvRunner, EpisodeKey
from vcppo.envs.tools import UNSANDBOXED_KEY
from vcppo.experience import Rollout, make_layout
from vcppo.config.schema import Config


class ObservationEncoder:
    """An observation's token ids, as the chat template renders a user (or tool) turn after the
    assistant's: what closes the assistant's turn after its end-of-turn token, the new turn, and
    the opening of the next assistant turn. Without a chat template: ``"\\n" + text + "\\n"``."""

    MARK = "\x00OBS\x00"

    def __init__(self, tokenizer):
        self.tokenizer, self.eos = tokenizer, tokenizer.eos_token
        self._frames = {role: self._frame(role) for role in ("user", "tool")}

    def _frame(self, role: str) -> tuple[str, str]:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None) or not self.eos:
            return "\n", "\n"
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        first = tok.apply_chat_template(base, tokenize=False)
        second = tok.apply_chat_template(base + [{"role": role, "content": self.MARK}], tokenize=False,
                                         add_generation_prompt=True)
        end = first.rfind("a" + self.eos)
        if end < 0 or not second.startswith(first):
            return "\n", "\n"
        closing = first[end + 1 + len(self.eos):]  # after the assistant's end-of-turn token
        before, _, after = second[len(first):].partition(self.MARK)
        return closing + before, after

    def __call__(self, text: str, role: str = "user", closed: bool = True) -> list[int]:
        """The ids of observation ``text`` in a ``role`` turn; ``closed``: the model's turn ended with
        the end-of-turn token (else it is added first, so the template stays well-formed)."""
        before, after = self._frames[role]
        return self.tokenizer.encode(("" if closed else self.eos) + before + text + after, add_special_tokens=False)


@dataclass
class Episode:
    """One episode of one prompt sample while it runs (ids after the prompt)."""
    prompt_index: int
    key: EpisodeKey
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    policy: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rewards: list[tuple[int, float]] = field(default_factory=list)  # (token index, turn reward)
    actions: list[str] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    solved: bool = False
    failed: bool = False
    tool_calls: int = 0
    tool_errors: int = 0
    text_errors: int = 0  # observations that were not valid Unicode (answered escaped)
    last_answer: tuple[int, Turn] | None = None  # (actions so far, the env's answer to the last of them)

    @property
    def turns(self) -> int:
        return len(self.actions)


def env_row(row: dict) -> dict:
    """What an env's ``reset`` reads of a data row: its answer as text and the row's reward info
    (``data_source``, ``extra_info``: verl's rows carry their env arguments there)."""
    answer = row.get("answer")
    return {"answer": None if answer is None else str(answer), **getattr(answer, "reward_info", {})}


def env_args_of(cfg_args: dict, row: dict) -> dict:
    """``rollout.env_args`` updated by the row's own: verl's ``extra_info.interaction_kwargs`` and
    ``tools_kwargs``, and an ``env_args`` entry of ``extra_info``."""
    args = dict(cfg_args)
    extra = env_row(row).get("extra_info") or {}
    for key in ("interaction_kwargs", "tools_kwargs", "env_args"):
        if isinstance(extra, dict) and isinstance(extra.get(key), dict):
            args.update({k: v for k, v in extra[key].items() if k != "name"})
    return args


def episode_runner(cfg: Config, rollout, num_workers: int, max_model_len: int | None = None) -> "EpisodeRunner":
    """The episodes of ``rollout.env``, their env in ``num_workers`` worker processes (0: in this
    process); ``max_model_len``: the engine's context (default: the run's)."""
    return EpisodeRunner(cfg, rollout, EnvRunner(num_workers, cfg.rollout.env_timeout_s),
                         max_model_len=max_model_len or cfg.data.max_prompt_tokens + cfg.rollout.max_response_tokens)


class EpisodeRunner:
    """A step's episodes on this rank (``rollout``: the engine; ``envs``: the env worker pool)."""

    def __init__(self, cfg: Config, rollout, envs: EnvRunner, max_model_len: int):
        self.cfg, self.rollout, self.envs, self.max_model_len = cfg, rollout, envs, max_model_len
        self.encode = ObservationEncoder(rollout.tokenizer)
        self.errors = EnvErrorLog(cfg.rollout.env)
        self.replay_checked = cfg.rollout.env in BUILTIN  # a user env is replayed once, at its first episodes
        self.env_seconds = 0.0  # spent waiting on env turns, over the runner's life
        self.said_unsandboxed = False

    def start(self, rows: list[dict], n: int, seed: int, key: str) -> list[Episode]:
        """``n`` episodes per row; ``key``: the phase's seed key (``ppo``, ``ppo/retry1``, ``val``)."""
        r = self.cfg.rollout
        out = []
        for i, row in enumerate(rows):
            info = tuple(sorted(env_row(row).items(), key=lambda kv: kv[0]))
            args = tuple(sorted(env_args_of(dict(r.env_args), row).items()))
            self._say_if_unsandboxed(dict(args))
            for j in range(n):
                ident = EpisodeKey(f"{key}/{seed}/{i}/{j}", r.env, args, info, seed * 1009 + i * 31 + j)
                out.append(Episode(i, ident, list(row["prompt_ids"])))
        return out

    def _say_if_unsandboxed(self, args: dict) -> None:
        """Once per run, in its log: the python tool runs model code without the sandbox."""
        if args.get(UNSANDBOXED_KEY) and not self.said_unsandboxed:
            self.said_unsandboxed = True
            print(f"[vcppo] WARNING: {UNSANDBOXED_KEY}=true: the python tool runs model-written code UNSANDBOXED, "
                  "with this trainer's user, environment, files and network", flush=True)

    def room(self, e: Episode) -> int:
        """The tokens the episode may still take (``rollout.max_response_tokens`` and the context)."""
        return min(self.cfg.rollout.max_response_tokens - len(e.tokens),
                   self.max_model_len - len(e.prompt_ids) - len(e.tokens))

    def budget(self, e: Episode) -> int:
        """The next turn's token budget: the episode's room, at most ``rollout.turn_max_tokens``."""
        cap = self.cfg.rollout.turn_max_tokens
        return min(self.room(e), cap) if cap else self.room(e)

    def run(self, rows: list[dict], n: int, seed: int, key: str, temperature: float,
            logprobs: bool) -> list[Episode]:
        """``n`` episodes per row, every turn of every live episode sampled in one vLLM call."""
        r = self.cfg.rollout
        episodes = self.start(rows, n, seed, key)
        for turn in range(r.max_turns):
            live = [e for e in episodes if not e.done]
            for e in live:
                if self.budget(e) <= 0:
                    e.done = e.truncated = True
            live = [e for e in live if not e.done]
            if not live:
                break
            samples = self.rollout.generate([e.prompt_ids + e.tokens for e in live], n=1, temperature=temperature,
                                            top_p=r.top_p, max_tokens=[self.budget(e) for e in live],
                                            stop=r.stop or None, seed=seed * 1_000_003 + turn, logprobs=logprobs,
                                            reset_cache=turn == 0)
            stepped = []
            for e, s in zip(live, samples):
                room = self.room(e)
                e.tokens += s.response_ids
                e.policy += [1.0] * len(s.response_ids)
                e.logprobs += s.logprobs if logprobs else [0.0] * len(s.response_ids)
                if not s.response_ids or (s.finish_reason == "length" and len(s.response_ids) >= room):
                    e.done = e.truncated = True  # the episode's budget ran out inside this turn
                    e.actions.append(s.text)
                    continue
                # a turn cut at rollout.turn_max_tokens is still the turn: the env answers it
                stepped.append((e, self.rollout.tokenizer.decode(s.response_ids, skip_special_tokens=True)))
            start = time.perf_counter()
            answers = self.envs.step([(action, dataclasses.replace(e.key, actions=tuple(e.actions)))
                                      for e, action in stepped])
            self.env_seconds += time.perf_counter() - start
            for (e, action), answer in zip(stepped, answers):
                e.actions.append(action)
                self.record(e, answer, last_turn=turn == r.max_turns - 1)
        if not self.replay_checked:
            self.replay_checked = check_replay(self.envs, episodes, self.cfg.rollout.env)
        return episodes

    def record(self, e: Episode, answer: Turn | str, last_turn: bool = False) -> None:
        """The env's answer to ``e``'s last turn: its reward on the turn's last model token, the
        observation appended (or the end of the episode). ``last_turn``: ``rollout.max_turns`` ran
        out, so the episode is cut here (an episode always ends on a model token)."""
        last = len(e.tokens) - 1
        if isinstance(answer, str):  # the env failed: the episode ends, scored wrong, counted
            self.errors.failed(e.turns, answer)
            e.rewards.append((last, self.cfg.reward.wrong_score))
            e.done = e.failed = True
            return
        e.rewards.append((last, answer.reward))
        e.last_answer = (len(e.actions), answer)
        e.tool_calls += answer.tool_calls
        e.tool_errors += answer.tool_errors
        e.solved = e.solved or answer.solved
        if answer.terminated or answer.truncated:  # the env's end, with its reward: an outcome, not a cut
            e.done = True
            return
        if last_turn:
            e.done = e.truncated = True
            return
        closed = e.tokens[-1] == self.rollout.tokenizer.eos_token_id
        text, ok = readable(answer.observation)
        if not ok:
            e.text_errors += 1
            self.errors.unreadable(e.turns)
        obs = self.encode(text, answer.role, closed=closed)
        if len(e.tokens) + len(obs) >= min(self.cfg.rollout.max_response_tokens,
                                           self.max_model_len - len(e.prompt_ids)):
            e.done = e.truncated = True  # no room for the observation and a reply
            return
        e.tokens += obs
        e.policy += [0.0] * len(obs)
        e.logprobs += [0.0] * len(obs)


def episodes_rollout(episodes: list[Episode], first_index: int, pad_id: int, device, logprobs: bool) -> Rollout:
    """The episodes as a :class:`Rollout` (module docstring: the layout and the rewards)."""
    layout = make_layout([e.prompt_ids for e in episodes], [e.tokens for e in episodes], pad_id=pad_id, device=device)
    B, R = layout.responses.shape
    policy = torch.zeros(B, R, dtype=torch.float32)
    rewards = torch.zeros(B, R, dtype=torch.float32)
    sampled = torch.zeros(B, R, dtype=torch.float32)
    for i, e in enumerate(episodes):
        policy[i, :len(e.policy)] = torch.tensor(e.policy)
        sampled[i, :len(e.logprobs)] = torch.tensor(e.logprobs, dtype=torch.float32)
        for index, reward in e.rewards:
            rewards[i, index] += reward
    scores = rewards.sum(1)
    layout.policy_mask = policy.to(device)
    return Rollout(**layout.layout_fields(), scores=scores.to(device), token_rewards=rewards.to(device),
                   group=torch.tensor([first_index + e.prompt_index for e in episodes], device=device),
                   correct=torch.tensor([float(e.solved) for e in episodes], device=device),
                   truncated=torch.tensor([float(e.truncated) for e in episodes], device=device),
                   sampler_logprobs=sampled.to(device) if logprobs else None)


def episode_metrics(episodes: list[Episode], env_seconds: float) -> dict:
    """This rank's episode figures (summed over ranks by the caller)."""
    model = sum(sum(e.policy) for e in episodes)
    total = sum(len(e.tokens) for e in episodes)
    return {"env/episodes": float(len(episodes)), "env/turns": float(sum(e.turns for e in episodes)),
            "env/tool_calls": float(sum(e.tool_calls for e in episodes)),
            "env/tool_errors": float(sum(e.tool_errors for e in episodes)),
            "env/failures": float(sum(e.failed for e in episodes)),
            "env/text_errors": float(sum(e.text_errors for e in episodes)),
            "env/obs_tokens": float(total - model), "env/tokens": float(total), "env/seconds": env_seconds}


def summed_episode_metrics(figures: dict) -> dict:
    """The step's episode metrics over every rank (collective): turns and tool calls per episode,
    tool errors and env failures, the share of observation tokens, and the env's seconds."""
    keys = sorted(figures)
    total = dict(zip(keys, collectives.all_reduce_sum(torch.tensor(
        [figures[k] for k in keys], dtype=torch.float64, device=collectives.comm_device())).tolist()))
    n = max(total["env/episodes"], 1.0)
    return {"env/turns_mean": total["env/turns"] / n, "env/tool_calls_mean": total["env/tool_calls"] / n,
            "env/tool_errors": total["env/tool_errors"], "env/failures": total["env/failures"],
            "env/text_errors": total["env/text_errors"], "env/episodes": total["env/episodes"],
            "env/obs_token_frac": total["env/obs_tokens"] / max(total["env/tokens"], 1.0),
            "time/env_s": figures["env/seconds"], "time/episodes_s": figures["env/rollout_seconds"]}
