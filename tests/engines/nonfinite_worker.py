"""Run by tests/engines/test_nonfinite.py on 2 ranks started by hand (tests/conftest.py; gloo, ZeRO-3):
only rank 1's advantages are non-finite, yet both ranks must skip the step together (no deadlock,
no update anywhere); a finite step afterwards is applied on both. Each rank writes its figures."""
import argparse
import dataclasses
import json
import os
import sys

import torch


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=None)  # passed by the deepspeed launcher
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from tests.engines.token_loss import nll_loss
    from vcppo.runtime import dist
    from vcppo.engines.actor import ActorEngine
    from vcppo.experience import ActorBatch, Rollout, make_layout
    from vcppo.config.schema import ActorConfig

    info = dist.init_distributed("cpu")
    actor = ActorEngine(args.model, ActorConfig(lr=1e-3, micro_batch_size=1), info, total_optimizer_steps=4)
    r = Rollout.unscored(make_layout([[5, 6], [7, 8, 9]], [[10, 11, 12], [13, 14]], pad_id=0))
    b = ActorBatch(**vars(r), advantages=torch.zeros_like(r.policy_mask, dtype=torch.float32))
    if info.rank == 1:
        b.advantages[0, 0] = float("nan")
    before = actor.full_state_dict()
    bad = actor.train_step(b, nll_loss())
    unchanged = all(torch.equal(v, before[k]) for k, v in actor.full_state_dict().items())
    b = dataclasses.replace(b, advantages=torch.zeros_like(b.advantages))
    good = actor.train_step(b, nll_loss())
    moved = not all(torch.equal(v, before[k]) for k, v in actor.full_state_dict().items())
    with open(os.path.join(args.out, f"rank{info.rank}.json"), "w") as f:
        json.dump({"bad": bad["nonfinite_skipped"], "unchanged": unchanged, "good": good["nonfinite_skipped"],
                   "moved": moved}, f)
    dist.shutdown(wait_for_peers=True)
    dist.exit_process(0)  # as the vcppo CLI ends a multi-rank run


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main(sys.argv[1:])
