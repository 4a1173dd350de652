"""The loss interface of :meth:`~vcppo.engines.deepspeed_engine.DeepSpeedModelEngine.train_step`: the
global token / sequence counts a loss normalises by, what a model's forward returns, the
:class:`EngineLoss` protocol every loss implements (the gradient contract is the engine's), and the
plainest such loss, :class:`ResponseNLL`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from vcppo.algos.losses import aggregate_loss
from vcppo.runtime import collectives
from vcppo.experience import Layout

RESPONSE = "response"  # the count mask of every response token


def response_counts(minibatch: Layout) -> dict[str, torch.Tensor]:
    """``count_masks`` of a loss that averages over every response token / sequence."""
    return {RESPONSE: minibatch.policy_mask}


@dataclass(frozen=True)
class GlobalCounts:
    """Per named (B, R) mask: valid tokens and sequences with >= 1 valid token, summed over ranks.

    ``tokens[name]`` is N_tok and ``sequences[name]`` N_seq of :func:`vcppo.algos.losses.aggregate_loss`
    for the whole global mini-batch.
    """
    tokens: dict[str, float]
    sequences: dict[str, float]

    @classmethod
    def over_ranks(cls, masks: dict[str, torch.Tensor]) -> "GlobalCounts":
        names = sorted(masks)
        local = [float((masks[n] != 0).sum()) for n in names] + \
                [float(((masks[n] != 0).sum(-1) > 0).sum()) for n in names]
        total = collectives.all_reduce_sum(torch.tensor(local, dtype=torch.float64, device=collectives.comm_device())).tolist()
        k = len(names)
        return cls(tokens=dict(zip(names, total[:k])), sequences=dict(zip(names, total[k:])))

    def local_share(self, name: str, micro_mask: torch.Tensor, agg: str) -> float:
        """Global count / this micro-batch's count: turns a micro-batch's share of the global loss
        back into its own mean (for metrics)."""
        if agg == "token-mean":
            return self.tokens[name] / max(float((micro_mask != 0).sum()), 1.0)
        return self.sequences[name] / max(float(((micro_mask != 0).sum(-1) > 0).sum()), 1.0)


@dataclass
class ModelOutputs:
    """What an engine's forward pass gives a loss, aligned with ``Layout.responses``.

        logprobs (b, R)  log pi(a_t | s_t) of the response tokens (actor)
        entropy  (b, R)  per-token entropy, when the loss asked for it (actor)
        values   (b, R)  V(s_t), the value of the state before response token t (critic)
    All zero at padded response positions.
    """
    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


class EngineLoss(Protocol):
    """A loss :meth:`DeepSpeedModelEngine.train_step` can optimise.

    ``needs_entropy``: the forward pass must also return the per-token entropy.
    ``count_masks(minibatch)``: the (B, R) masks the loss averages over, by name (e.g. every
        response token; VAPO's positive-example NLL averages over correct samples only). The
        engine turns them into :class:`GlobalCounts`.
    ``__call__(outputs, micro, counts)``: (0-d loss, metrics). The loss is normalised by
        ``counts``, i.e. it is this micro-batch's share of the loss on the global mini-batch.
    """
    needs_entropy: bool

    def count_masks(self, minibatch: Layout) -> dict[str, torch.Tensor]: ...

    def __call__(self, outputs: ModelOutputs, micro: Layout,
                 counts: GlobalCounts) -> tuple[torch.Tensor, dict[str, Any]]: ...


class ResponseNLL:
    """Token-mean NLL over the response tokens of the whole (global) batch (SFT's loss); its metric,
    under ``metric``, is this micro-batch's own token-mean NLL."""
    needs_entropy = False

    count_masks = staticmethod(response_counts)

    def __init__(self, metric: str = "nll_token"):
        self.metric = metric

    def __call__(self, outputs: ModelOutputs, micro: Layout, counts: GlobalCounts):
        mask = micro.policy_mask
        nll = aggregate_loss(-outputs.logprobs, mask, "token-mean", global_token_count=counts.tokens[RESPONSE])
        return nll, {self.metric: (-(outputs.logprobs * mask).sum() / mask.sum().clamp(min=1)).detach()}
