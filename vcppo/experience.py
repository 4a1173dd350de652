"""What flows between the stages of a step, typed by stage.

Notation: B samples, P = longest prompt, R = longest response, L = P + R. Prompts are LEFT-padded
to P and responses RIGHT-padded to R (verl's layout), so response token t (0-based) sits at column
P + t and is predicted by the logits at column P + t - 1: response logprobs / values are read at
columns P-1 .. P+R-2. Every (B, R) tensor is zero at padded response positions.

The stages of one RL step (:mod:`vcppo.driver.step.rl_step`), each returning what it adds:

    sampling + scoring      -> :class:`Rollout`        (the layout and the verifier's reward)
    the current models      -> :class:`BeforeUpdate`   (pi_old, entropy, KL, V_old, as the plan takes them)
    advantage estimation    -> :class:`Advantages`     (the actor's advantages, the critic's targets)
    the critic / actor update reads :class:`CriticBatch` / :class:`ActorBatch` (a rollout plus
    exactly the tensors its loss needs) and returns :class:`UpdateResult`.

:class:`Layout` alone is what SFT and the forward passes need.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, TypeVar

import torch

Tensor = torch.Tensor
L = TypeVar("L", bound="Layout")


@dataclass(kw_only=True)
class Layout:
    """Padded prompt + response tokens (:func:`make_layout`).

        input_ids        (B, L) long   prompt left-padded to P, then response right-padded to R
        attention_mask   (B, L) long   1 on real tokens
        position_ids     (B, L) long   cumsum(attention_mask) - 1, clamped at 0 (as vLLM saw them)
        responses        (B, R) long   response tokens (pad id after the end)
        policy_mask      (B, R) float  1 on the tokens the policy wrote, the ones every loss, KL,
                                       entropy and advantage reads: every response token of a single
                                       response; an episode's model tokens, 0 on its observations
                                       (its length is NOT this mask's sum: :func:`response_lengths`)
        prompt_len       int           P
    Subclasses add per-sample tensors ((B,) or (B, R)); every method below carries them along.
    """
    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    responses: Tensor
    policy_mask: Tensor
    prompt_len: int

    @property
    def size(self) -> int:
        """B."""
        return int(self.input_ids.shape[0])

    def _map(self: L, fn) -> L:
        """A copy with ``fn`` applied to every per-sample tensor."""
        return dataclasses.replace(self, **{f.name: fn(v) for f in dataclasses.fields(self)
                                            if isinstance(v := getattr(self, f.name), Tensor)})

    def select(self: L, idx: slice | Tensor | list[int]) -> L:
        """Rows ``idx`` (a slice, index list or index tensor) of every per-sample tensor."""
        if isinstance(idx, slice):
            return self._map(lambda t: t[idx])
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        return self._map(lambda t: t[idx_t.to(t.device)])

    def to(self: L, device: torch.device | str) -> L:
        return self._map(lambda t: t.to(device))

    def split(self: L, n_chunks: int) -> list[L]:
        """Contiguous chunks of (nearly) equal size, in order (the first ones take the remainder)."""
        B = self.size
        n_chunks = max(1, min(int(n_chunks), B))
        sizes = [B // n_chunks + (1 if i < B % n_chunks else 0) for i in range(n_chunks)]
        starts = [sum(sizes[:i]) for i in range(n_chunks)]
        return [self.select(slice(s, s + n)) for s, n in zip(starts, sizes)]

    def micro_batches(self: L, micro_batch_size: int | None) -> list[L]:
        """Chunks of at most ``micro_batch_size`` rows (one chunk when None)."""
        B = self.size
        if not micro_batch_size or micro_batch_size >= B:
            return [self]
        return [self.select(slice(s, s + micro_batch_size)) for s in range(0, B, micro_batch_size)]

    def layout_fields(self) -> dict:
        """The :class:`Layout` fields of this batch, to build a richer stage from it."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Layout)}


@dataclass(kw_only=True)
class Rollout(Layout):
    """A step's samples on this rank, sampled and scored (:func:`vcppo.driver.step.sampler.collect_rollout`).

        scores           (B,)   float  verifier reward of the whole response (+ overlong shaping)
        token_rewards    (B, R) float  the score on the last response token, 0 elsewhere
        group            (B,)   long   global index of the prompt (GRPO groups, pass@k)
        correct          (B,)   float  1.0 where the answer verified
        truncated        (B,)   float  1.0 where the response hit max_response_tokens
        sampler_logprobs (B, R) float  vLLM's logprob of each sampled token; None when the run does
                                       not ask for them (``rollout.sampler_logprobs``)
        has_rule         (B,)   float  1.0 where the row's data_source has a rule of its own
                                       (``reward.functions_by_source``); None without such rules
        response_lengths (B,)   float  each sample's length (:func:`response_lengths`: model and
                                       observation tokens); taken from the layout when not given
    """
    scores: Tensor
    token_rewards: Tensor
    group: Tensor
    correct: Tensor
    truncated: Tensor
    sampler_logprobs: Optional[Tensor] = None
    has_rule: Optional[Tensor] = None
    response_lengths: Optional[Tensor] = None

    def __post_init__(self):
        if self.response_lengths is None:
            self.response_lengths = response_lengths(self)

    @classmethod
    def unscored(cls, layout: Layout) -> "Rollout":
        """Tokens that no verifier scored (the benchmarks' and tests' batches): zero rewards, every
        row its own prompt group, nothing correct or truncated."""
        B, dev = layout.size, layout.input_ids.device
        zeros = torch.zeros(B, device=dev)
        return cls(**layout.layout_fields(), scores=zeros, token_rewards=torch.zeros_like(layout.policy_mask),
                   group=torch.arange(B, device=dev), correct=zeros.clone(), truncated=zeros.clone())


def response_lengths(layout: Layout) -> Tensor:
    """(B,) float32: the length of each sample, the one definition every length rule reads (DAPO's
    overlong penalty, VAPO's length-adaptive lambda, the response/length metrics): its tokens after
    the prompt, model AND observation tokens of an episode.

    Why both: ``rollout.max_response_tokens`` budgets an episode in these tokens (an episode is cut,
    ``truncated``, when they fill it), and so does the context; a length compared with that budget
    must count what the budget counts. The policy mask's sum (model tokens only) would leave an
    episode that ran out of budget unpenalised. VAPO's horizon 1 / (1 - lambda) = alpha * length then
    spans the whole episode: on an episode with observations (which GAE steps over without decay)
    its lambda is a little closer to 1 than one from model tokens, the side VAPO's rule errs to for
    long sequences. Single responses have no observation tokens: both counts agree."""
    return layout.attention_mask[:, layout.prompt_len:].sum(1).to(torch.float32)


def last_token_index(policy_mask: Tensor) -> Tensor:
    """(B,) long: the column of each row's last policy token (0 for an empty row); the mask may have
    holes (an episode's observation tokens)."""
    cols = torch.arange(1, policy_mask.shape[1] + 1, device=policy_mask.device)
    return ((policy_mask > 0).long() * cols).max(1).values.clamp(min=1) - 1


def last_token_rewards(scores: Tensor, policy_mask: Tensor) -> Tensor:
    """(B,) sequence scores -> (B, R) float32 per-token rewards: each score on its row's last
    response token (the paper's outcome reward at <eos>), 0 elsewhere."""
    B, R = policy_mask.shape
    last = last_token_index(policy_mask)
    rewards = torch.zeros(B, R, dtype=torch.float32, device=policy_mask.device)
    rewards[torch.arange(B, device=policy_mask.device), last] = scores
    return rewards


@dataclass(kw_only=True)
class ActorBatch(Rollout):
    """What the actor's update trains on.

        advantages   (B, R) float  the actor's advantages as the loss uses them (whitened when
                                   ``algorithm.whiten_advantages``)
        old_logprobs (B, R) float  pi_old; None when the plan takes it from the update's own forward
        ref_logprobs (B, R) float  the reference policy's, when the KL is a loss term; else None
    """
    advantages: Tensor
    old_logprobs: Optional[Tensor] = None
    ref_logprobs: Optional[Tensor] = None


@dataclass(kw_only=True)
class CriticBatch(Rollout):
    """What the critic's update trains on.

        returns    (B, R) float  value targets (GAE with lambda_critic)
        old_values (B, R) float  V_old, the clip's anchor; None when the plan takes it from the
                                 update's own forward
    """
    returns: Tensor
    old_values: Optional[Tensor] = None


@dataclass
class BeforeUpdate:
    """What the models said about a rollout with the weights of before this step's updates.
    The step fills it from passes before the updates (or the sampler), and, where the step plan
    takes a quantity from an update's own forward (:class:`vcppo.driver.step.step_plan.StepPlan`), from that
    update's :class:`UpdateResult` once it ran; None where the plan produces it nowhere.

        old_logprobs (B, R) float  pi_old: an actor pass, the sampler's logprobs, or the update's forward
        entropy      (B, R) float  the actor's per-token entropy (same source as pi_old, or the update's)
        ref_logprobs (B, R) float  the reference policy's logprobs (when some KL is on)
        kl           (B, R) float  per-token KL estimate of pi_old against the reference policy
        old_values   (B, R) float  V_old: a critic pass, or the critic update's forward
    """
    old_logprobs: Optional[Tensor] = None
    entropy: Optional[Tensor] = None
    ref_logprobs: Optional[Tensor] = None
    kl: Optional[Tensor] = None
    old_values: Optional[Tensor] = None


@dataclass
class Advantages:
    """Advantage estimation's output (:func:`vcppo.driver.step.update.estimate`).

        advantages     (B, R) float  the actor's advantages as the loss uses them
        raw_advantages (B, R) float  before whitening (the position-profile diagnostic)
        lambda_actor   (B,)   float  per-sequence lambda (VAPO's length-adaptive lambda), else None
        returns        (B, R) float  the critic's targets at lambda_critic from the same GAE pass, when a
                                     critic trains on them in this process; else None (what the
                                     critic trained on is its :class:`CriticResult`)
    """
    advantages: Tensor
    raw_advantages: Tensor
    lambda_actor: Optional[Tensor] = None
    returns: Optional[Tensor] = None


@dataclass
class CriticResult:
    """The critic's side of one step (:mod:`vcppo.driver.step.critic_side`).

        returns  (B, R) float  the value targets it trained on: GAE with lambda_critic from V_old,
                               or Monte-Carlo returns-to-go when it trained first; 0 off the mask
        metrics  dict          its update's metrics (the critic ranks' timings too, when remote)
    """
    returns: Tensor
    metrics: dict


@dataclass
class UpdateResult:
    """What an update returns: its metrics, and what its own forward passes kept when the plan
    takes pi_old / V_old / entropy from them (each (B, R), in the batch's row order; else None)."""
    metrics: dict
    logprobs: Optional[Tensor] = None
    entropy: Optional[Tensor] = None
    values: Optional[Tensor] = None


def make_layout(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int,
                device: torch.device | str = "cpu") -> Layout:
    """The padded layout of ``B`` (prompt, response) token lists."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if not prompt_ids:
        raise ValueError("empty batch")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("empty prompt: the first response token needs at least one prompt token")
    B = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    R = max(1, max(len(r) for r in response_ids))
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        input_ids[i, P - len(p):P] = torch.as_tensor(p, dtype=torch.long)
        attn[i, P - len(p):P] = 1
        if r:
            input_ids[i, P:P + len(r)] = torch.as_tensor(r, dtype=torch.long)
            attn[i, P:P + len(r)] = 1
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return Layout(input_ids=input_ids.to(device), attention_mask=attn.to(device),
                  position_ids=position_ids.to(device), responses=input_ids[:, P:].clone().to(device),
                  policy_mask=attn[:, P:].to(torch.float32).to(device), prompt_len=P)


LAYOUT_FIELDS = ("input_ids", "attention_mask", "position_ids")  # (B, L) = (B, P + R)


def _pad_value(batch: L) -> int:
    """The pad id a batch was laid out with (0 when it has no pad position at all)."""
    pads = batch.input_ids[batch.attention_mask == 0]
    return int(pads[0]) if pads.numel() else 0


def _relayout(batch: L, P: int, R: int, pad_id: int) -> L:
    """``batch`` re-padded to prompt width ``P`` and response width ``R``: columns are added on the
    left of the prompt / the right of the response, or dropped there when narrower (the caller
    only drops all-pad columns: :func:`compact`), so every real token keeps its position id."""
    p0, r0 = batch.prompt_len, batch.responses.shape[1]
    dp, dr = P - p0, R - r0

    def fit(t: Tensor, left: int, right: int, fill) -> Tensor:
        if left < 0:
            t = t[:, -left:]
        if right < 0:
            t = t[:, :t.shape[1] + right]
        pad = (max(left, 0), max(right, 0))
        if pad == (0, 0):
            return t
        shape = (t.shape[0], pad[0] + t.shape[1] + pad[1])
        out = torch.full(shape, fill, dtype=t.dtype, device=t.device)
        out[:, pad[0]:pad[0] + t.shape[1]] = t
        return out

    changes: dict = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if not isinstance(v, Tensor) or v.dim() != 2:
            continue
        if f.name in LAYOUT_FIELDS:
            changes[f.name] = fit(v, dp, dr, pad_id if f.name == "input_ids" else 0)
        else:  # (B, R) response-aligned
            changes[f.name] = fit(v, 0, dr, pad_id if f.name == "responses" else 0)
    attn = changes["attention_mask"]
    changes["position_ids"] = (attn.cumsum(-1) - 1).clamp(min=0)
    return dataclasses.replace(batch, prompt_len=P, **changes)


def compact(batch: L) -> L:
    """``batch`` without the prompt columns that are padding in every row and the response columns
    masked in every row (a row subset of a wide batch keeps the batch's width otherwise)."""
    prompt_real = batch.attention_mask[:, :batch.prompt_len].sum(0) > 0
    P = batch.prompt_len - int(prompt_real.long().argmax()) if bool(prompt_real.any()) else 1
    real_cols = (batch.attention_mask[:, batch.prompt_len:].sum(0) > 0).nonzero()
    R = int(real_cols.max()) + 1 if real_cols.numel() else 1
    return _relayout(batch, P, R, _pad_value(batch))


def concat_batches(batches: list[L], pad_id: int | None = None) -> L:
    """The rows of several batches (any prompt / response widths) in one batch, in order.

    All batches must be of one stage type, and every field set in one batch must be set in all. ``pad_id`` defaults to the pad id found in
    the batches (0 if none has a pad position).
    """
    if not batches:
        raise ValueError("concat_batches: no batches")
    if len({type(b) for b in batches}) > 1:
        raise ValueError("concat_batches: batches of different stage types")
    names = [f.name for f in dataclasses.fields(batches[0])]
    for f in names:
        set_in = [getattr(b, f) is not None for b in batches]
        if any(set_in) and not all(set_in):
            raise ValueError(f"concat_batches: field {f!r} is set in some batches but not in others")
    if len(batches) == 1:
        return batches[0]
    if pad_id is None:
        pad_id = next((_pad_value(b) for b in batches if bool((b.attention_mask == 0).any())), 0)
    P = max(b.prompt_len for b in batches)
    R = max(b.responses.shape[1] for b in batches)
    wide = [_relayout(b, P, R, pad_id) for b in batches]
    return dataclasses.replace(wide[0], **{f: torch.cat([getattr(b, f) for b in wide])
                                            for f in names if isinstance(getattr(wide[0], f), Tensor)})
