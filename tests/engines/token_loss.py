"""A per-token loss for engine tests, following the engine's loss interface (EngineLoss)."""
from vcppo.engines.loss_contract import RESPONSE, response_counts


class TokenLoss:
    """sum over response tokens of ``per_token(outputs, micro)``, divided by the GLOBAL token count
    the engine hands over: summed over micro-batches and ranks, it is the mean over the whole batch."""
    needs_entropy = False

    def __init__(self, per_token):
        self.per_token = per_token

    count_masks = staticmethod(response_counts)

    def __call__(self, outputs, micro, counts):
        loss = (self.per_token(outputs, micro) * micro.policy_mask).sum() / counts.tokens[RESPONSE]
        return loss, {"loss_sum": loss.detach()}


def nll_loss() -> TokenLoss:
    return TokenLoss(lambda out, micro: -out.logprobs)


def value_mse_loss() -> TokenLoss:
    return TokenLoss(lambda out, micro: 0.5 * (out.values - micro.returns) ** 2)
