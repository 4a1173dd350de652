"""Run by tests/engines/test_sequence_parallel.py on 1, 2 or 4 ranks started by hand.

Every rank takes its contiguous share of one fixed GLOBAL batch (ragged: a 2-token sequence, odd
lengths), as the driver hands out a step's batch. The actor and the critic (``--sp``: their
sequence_parallel_size) compute logprobs, entropies and values, then two optimizer steps each;
the full gradient of every parameter is captured before each step. Rank 0 writes it all, so the
test compares layouts (1 rank without SP against SP=2 on 2 ranks, 2 SP x 2 DP on 4 ranks).
"""
import argparse
import os
import sys

import torch


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sp", type=int, default=1, help="actor and critic sequence_parallel_size")
    ap.add_argument("--packed", action="store_true")
    ap.add_argument("--budget", type=int, default=0, help="max_tokens_per_micro_batch")
    ap.add_argument("--micro", type=int, default=1, help="micro_batch_size")
    ap.add_argument("--chunk", type=int, default=1024, help="actor logprob_chunk_size (0: full logits)")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--lora", action="store_true")
    args = ap.parse_args(argv)

    from deepspeed.utils import safe_get_full_grad

    from tests.engines.token_loss import TokenLoss, value_mse_loss
    from vcppo.runtime import dist
    from vcppo.runtime import collectives
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.critic import CriticEngine
    from vcppo.experience import CriticBatch, Rollout, make_layout
    from vcppo.config.schema import ActorConfig, CriticConfig, LoRAConfig

    info = dist.init_distributed("cpu")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    # (prompt, response) lengths: a 2-token sequence, odd totals, one longer than a budget of 15
    shapes = [(1, 1), (3, 6), (5, 2), (2, 9), (4, 5), (2, 3), (6, 7), (3, 4)]
    prompts = [[int(x) for x in torch.randint(5, 80, (p,), generator=g)] for p, _ in shapes]
    responses = [[int(x) for x in torch.randint(5, 80, (r,), generator=g)] for _, r in shapes]
    r = Rollout.unscored(make_layout(prompts, responses, pad_id=0))
    full = CriticBatch(**vars(r), returns=torch.linspace(-1, 1, r.responses.numel()).view_as(r.policy_mask))
    per = len(shapes) // info.world_size
    mine = full.select(slice(info.rank * per, (info.rank + 1) * per))

    lora = LoRAConfig(rank=4, alpha=8.0) if args.lora else LoRAConfig()
    common = dict(lr=1e-3, micro_batch_size=args.micro, grad_clip=0.0, max_tokens_per_micro_batch=args.budget,
                  packed=args.packed, sequence_parallel_size=args.sp, gradient_checkpointing=args.checkpointing,
                  lora=lora, zero_stage=3 if info.world_size > 1 else 0)
    actor = ActorEngine(args.model, ActorConfig(logprob_chunk_size=args.chunk, **common), info,
                        total_optimizer_steps=10)
    critic = CriticEngine("policy", args.model, CriticConfig(**common), info, total_optimizer_steps=10)

    def whole(t):  # this rank's (b, R) rows -> the global batch's (B, R), on every rank
        return collectives.gather_cat(t)

    result = {"attention": [getattr(actor, "attention", None), getattr(critic, "attention", None)]}
    lp, ent = actor.forward_logprobs(mine, with_entropy=True)
    result.update(logprobs=whole(lp), entropy=whole(ent), values=whole(critic.forward_values(mine)))

    loss = TokenLoss(lambda out, micro: -out.logprobs - 0.1 * out.entropy)
    loss.needs_entropy = True
    for name, engine, fn in (("actor", actor, loss), ("critic", critic, value_mse_loss())):
        grads = capture_grads(engine, safe_get_full_grad)
        metrics = [engine.train_step(mine, fn) for _ in range(2)]
        result[f"{name}_grad_norms"] = [m["grad_norm"] for m in metrics]
        result[f"{name}_loss_sums"] = [m["loss_sum"] for m in metrics]
        result[f"{name}_grads"] = grads
        result[f"{name}_weights"] = engine.full_state_dict()
    lp2, _ = actor.forward_logprobs(mine)
    result["logprobs_after"] = whole(lp2)
    result["values_after"] = whole(critic.forward_values(mine))
    if info.is_main:
        os.makedirs(args.out, exist_ok=True)
        torch.save(result, os.path.join(args.out, "result.pt"))
    collectives.barrier()
    dist.shutdown(wait_for_peers=True)
    return 0


def capture_grads(engine, get_grad) -> list:
    """Before each optimizer step of ``engine``: {parameter name: full gradient} (a collective under
    ZeRO-3, which every rank runs in step())."""
    steps: list = []
    step = engine.engine.step

    def step_capturing(*a, **k):
        grads = {}
        for n, p in engine.module.named_parameters():
            if p.requires_grad:
                grad = get_grad(p)
                grads[n] = None if grad is None else grad.detach().clone().cpu()
        steps.append(grads)
        return step(*a, **k)
    engine.engine.step = step_capturing
    return steps


if __name__ == "__main__":
    code = main(sys.argv[1:])
    from vcppo.runtime import dist
    dist.exit_process(code)
