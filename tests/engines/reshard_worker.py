"""Worker of tests/engines/test_universal_checkpoint.py: the actor and the critic (ZeRO-3) take one
step on a fixed global batch and then either save and take a second step (``--mode save``) or load
a universal checkpoint and take that second step (``--mode load``); rank 0 writes the weights."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=None)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=("save", "load"), required=True)
    args = ap.parse_args(argv)

    from tests.engines.token_loss import nll_loss, value_mse_loss
    from vcppo.driver.durability.conversion import weights_only_loading
    from vcppo.runtime import dist
    from vcppo.runtime import collectives
    from vcppo.engines.actor import ActorEngine
    from vcppo.engines.critic import CriticEngine
    from vcppo.engines.safe_checkpoint import use_weights_only_loading
    from vcppo.experience import CriticBatch, Rollout, make_layout
    from vcppo.config.schema import ActorConfig, CriticConfig

    info = dist.init_distributed("cpu")
    g = torch.Generator().manual_seed(1)
    prompts = [[int(x) for x in torch.randint(5, 80, (n,), generator=g)] for n in (3, 5, 2, 4)]
    responses = [[int(x) for x in torch.randint(5, 80, (n,), generator=g)] for n in (6, 2, 4, 5)]
    r = Rollout.unscored(make_layout(prompts, responses, pad_id=0))
    full = CriticBatch(**vars(r), returns=torch.linspace(-1, 1, r.responses.numel()).view_as(r.policy_mask))
    per = 4 // info.world_size
    mine = full.select(slice(info.rank * per, (info.rank + 1) * per))
    engines = {"actor": (ActorEngine(args.model, ActorConfig(lr=1e-3, micro_batch_size=1, zero_stage=3,
                                                              lr_schedule="cosine"), info, total_optimizer_steps=4),
                         nll_loss()),
               "critic": (CriticEngine("policy", args.model, CriticConfig(lr=1e-3, micro_batch_size=1, zero_stage=3),
                                       info, total_optimizer_steps=4), value_mse_loss())}
    for role, (engine, loss) in engines.items():
        if args.mode == "save":
            engine.train_step(mine, loss)
            engine.train_step(mine, loss)  # a second step: Adam's moments hold two gradients
            engine.save_checkpoint(os.path.join(args.out, "ckpt", role))
        else:
            use_weights_only_loading(engine.engine)
            with weights_only_loading():
                engine.load_checkpoint(os.path.join(args.out, "universal", role), universal=True)
        metrics = engine.train_step(mine, loss)
        weights = engine.full_state_dict()
        if info.is_main:
            torch.save({"weights": weights, "lr": metrics["lr"], "grad_norm": metrics["grad_norm"],
                        "steps": engine.global_steps},
                       os.path.join(args.out, f"{args.mode}_{role}_w{info.world_size}.pt"))
    collectives.barrier()
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
