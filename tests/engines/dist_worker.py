"""Run by tests/engines/test_distributed.py: 1 rank, or 2 (under the deepspeed launcher, or started by hand).

Every rank takes its contiguous share of one fixed GLOBAL batch, the loss functions normalise by
the global token count, and one actor and one critic train_step run. Rank 0 writes the summed
losses, grad norms and full updated weights, so the test can compare world sizes 1 and 2.
With --vllm each rank also builds its own vLLM engine, samples, syncs the updated actor weights
and checks logprobs; then everything is torn down with dist.shutdown() (exit code must be 0).
"""
import argparse
import json
import os
import sys

import torch


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=None)  # passed by the deepspeed launcher
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm", action="store_true")
    ap.add_argument("--budget", type=int, default=0, help="max_tokens_per_micro_batch (0: one row per micro-batch)")
    ap.add_argument("--packed", action="store_true", help="padding-free passes")
    ap.add_argument("--lora", action="store_true", help="LoRA adapters (rank 4) on the actor and the critic")
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl; vLLM really shards at TP 2)")
    args = ap.parse_args(argv)

    from tests.engines.token_loss import nll_loss, value_mse_loss
    from vcppo.runtime import dist
    from vcppo.runtime import collectives
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.critic import CriticEngine
    from vcppo.experience import CriticBatch, Rollout, make_layout
    from vcppo.config.schema import ActorConfig, CriticConfig, LoRAConfig, RolloutConfig

    info = dist.init_distributed(args.device)
    torch.manual_seed(0)
    # A fixed global batch of 4 samples with ragged prompts and responses.
    g = torch.Generator().manual_seed(1)
    prompts = [[int(x) for x in torch.randint(5, 80, (n,), generator=g)] for n in (3, 5, 2, 4)]
    responses = [[int(x) for x in torch.randint(5, 80, (n,), generator=g)] for n in (6, 2, 4, 5)]
    r = Rollout.unscored(make_layout(prompts, responses, pad_id=0))
    full = CriticBatch(**vars(r), returns=torch.linspace(-1, 1, r.responses.numel()).view_as(r.policy_mask))
    B, W = 4, info.world_size
    per = B // W
    # Each rank holds only its share; the engine counts the global tokens (the normaliser) itself.
    mine = full.select(slice(info.rank * per, (info.rank + 1) * per))

    lora = LoRAConfig(rank=4, alpha=8.0) if args.lora else LoRAConfig()
    acfg = ActorConfig(lr=1e-3, micro_batch_size=1, grad_clip=0.0, warmup_steps=0,
                       max_tokens_per_micro_batch=args.budget, packed=args.packed, lora=lora)
    ccfg = CriticConfig(lr=1e-3, micro_batch_size=1, grad_clip=0.0, max_tokens_per_micro_batch=args.budget,
                        packed=args.packed, lora=lora)
    result = {}
    rollout = None
    if args.vllm:
        from vcppo.engines.rollout import RolloutEngine
        # tensor_parallel_size = world size: the ranks form ONE rollout group (on CPU each runs an
        # unsharded vLLM, but a group must still send identical requests and split the outputs)
        rollout = RolloutEngine(args.model, RolloutConfig(gpu_memory_utilization=0.02,
                                                          tensor_parallel_size=info.world_size),
                                info, seed=0, max_model_len=128)
    actor = ActorEngine(args.model, acfg, info, total_optimizer_steps=10)
    critic = CriticEngine("policy", args.model, ccfg, info, total_optimizer_steps=10)

    result["micro_batches_per_rank"] = collectives.all_gather_object(len(actor.micro_batch_rows(mine)))
    n_tokens = float(full.policy_mask.sum())

    def global_mean(per_token):  # the loss the step optimises, evaluated independently of train_step
        return float(collectives.all_reduce_sum(torch.tensor([float((per_token * mine.policy_mask).sum())]))) / n_tokens

    a_loss = global_mean(-actor.forward_logprobs(mine)[0])
    am = actor.train_step(mine, nll_loss())
    c_loss = global_mean(0.5 * (critic.forward_values(mine) - mine.returns) ** 2)
    cm = critic.train_step(mine, value_mse_loss())
    cm2 = critic.train_step(mine, value_mse_loss())  # 2nd step: head non-zero -> backbone grads
    result.update(actor_loss=a_loss, actor_grad_norm=am["grad_norm"], critic_loss=c_loss,
                  critic_grad_norm=cm["grad_norm"], critic_grad_norm2=cm2["grad_norm"])
    am2 = actor.train_step(mine, nll_loss())  # 2nd step: B non-zero -> A gets gradients too (LoRA)
    result["actor_grad_norm2"] = am2["grad_norm"]
    actor_w = actor.full_state_dict()
    if args.lora:
        actor_w.update({f"adapter:{k}": v for k, v in actor.adapter_state_dict().items()})
    critic_w = critic.full_state_dict()
    values = critic.forward_values(full)
    # the trained critic as a `vcppo rm` directory (its head is non-zero now), scored as a reward model
    # by a frozen engine: ZeRO-3 over the ranks, each scoring its own share
    from vcppo.engines.reward_model import RewardModelEngine
    from vcppo.config.schema import EngineConfig
    rm_dir = os.path.join(args.out, "rm")
    critic.export(rm_dir)
    rm = RewardModelEngine(rm_dir, EngineConfig(micro_batch_size=1, packed=args.packed,
                                                max_tokens_per_micro_batch=args.budget), info)
    result["rm_scores"] = collectives.gather_cat(rm.score(mine)).tolist()

    if rollout is not None:
        prompts_r = [[5 + info.rank, 6, 7], [9, 10]]
        samples = rollout.generate(prompts_r, n=2, temperature=1.0, top_p=1.0, max_tokens=8, seed=3)
        b = make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples], 0)
        before, _ = actor.forward_logprobs(b)
        result["sync_s"] = rollout.sync_weights(actor.named_parameters_gathered())
        samples = rollout.generate(prompts_r, n=2, temperature=1.0, top_p=1.0, max_tokens=8, seed=3)
        b = make_layout([s.prompt_ids for s in samples], [s.response_ids for s in samples], 0)
        lp, _ = actor.forward_logprobs(b)
        vl = torch.zeros_like(lp)
        for i, s in enumerate(samples):
            vl[i, :len(s.logprobs)] = torch.tensor(s.logprobs)
        diffs = collectives.all_gather_object(float((lp - vl).abs().max()))
        result["vllm_vs_actor_maxdiff_per_rank"] = diffs
        result.update(rollout_group_check(rollout, info))
        collectives.barrier()

    if info.is_main:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"actor": actor_w, "critic": critic_w, "values": values}, os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(result, f)
    collectives.barrier()
    dist.shutdown(wait_for_peers=True)  # as a clean run ends (it also frees DeepSpeed's shm buffer)
    return 0


def rollout_group_check(rollout, info) -> dict:
    """The group samples the same prompts with the same seeds; each rank keeps its own prompts."""
    from vcppo.driver.step.sampler import collect_rollout, rollout_share
    from vcppo.runtime import collectives
    from vcppo.rewards.verifier import RewardScorer
    from vcppo.config.schema import RolloutConfig

    rows = [{"prompt_ids": [5 + i, 6, 7], "answer": "1"} for i in range(4)]
    sampled, kept = rollout_share(len(rows), info, rollout.cfg.tensor_parallel_size)
    group_rows = rows[sampled.start:sampled.stop]
    outputs = rollout.generate([r["prompt_ids"] for r in group_rows], n=2, temperature=1.0, top_p=1.0,
                               max_tokens=8, seed=11)
    batch = collect_rollout(group_rows, first_index=sampled.start, keep=kept, rollout=rollout,
                               scorer=RewardScorer(None, num_workers=0), pad_id=0, device=info.device,
                               sampling=RolloutConfig(n_samples_per_prompt=2, max_response_tokens=8), seed=11)
    return {"group_outputs_per_rank": collectives.all_gather_object([o.response_ids for o in outputs]),
            "kept_groups_per_rank": collectives.all_gather_object(sorted(set(batch.group.tolist())))}


if __name__ == "__main__":
    code = main(sys.argv[1:])
    from vcppo.runtime import dist
    dist.exit_process(code)  # as the vcppo CLI ends a multi-rank run
