"""What the policy wrote: a few of a step's samples as text, with what the step made of them
(``logging.log_samples``), for ``samples.jsonl``, a wandb table and ``vcppo report``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import Tensor

from vcppo.experience import Rollout


@dataclass(frozen=True)
class Sample:
    """One response and its scores. ``reward``: what advantage estimation received (the sum of the
    per-token rewards, the KL penalty included when it is in the reward); ``score``: the verifier's
    (plus overlong shaping); ``adv_*``: the actor's advantages over the response tokens, before whitening."""
    prompt: str
    response: str
    reward: float
    score: float
    correct: bool
    truncated: bool
    length: int
    adv_mean: float
    adv_min: float
    adv_max: float

    def record(self) -> dict:
        return dataclasses.asdict(self)


def pick_samples(rollout: Rollout, rewards: Tensor, advantages: Tensor, tokenizer, n: int) -> list[Sample]:
    """The first ``n`` samples of this rank's share as text. ``rewards``, ``advantages``: (B, R)."""
    P, out = rollout.prompt_len, []
    for i in range(min(n, rollout.size)):
        prompt = rollout.input_ids[i, :P][rollout.attention_mask[i, :P].bool()]
        on = rollout.policy_mask[i].bool()  # model tokens (an episode's observations are not)
        response = rollout.input_ids[i, P:][rollout.attention_mask[i, P:].bool()]  # the whole episode
        adv = advantages[i][on].float()
        out.append(Sample(
            prompt=tokenizer.decode(prompt.tolist(), skip_special_tokens=False),
            response=tokenizer.decode(response.tolist(), skip_special_tokens=False),
            reward=float(rewards[i][on].sum()), score=float(rollout.scores[i]), correct=bool(rollout.correct[i] > 0),
            truncated=bool(rollout.truncated[i] > 0), length=int(on.sum()),
            adv_mean=float(adv.mean()) if adv.numel() else 0.0, adv_min=float(adv.min()) if adv.numel() else 0.0,
            adv_max=float(adv.max()) if adv.numel() else 0.0))
    return out
