"""ZeRO-3 vs ZeRO-0 on one rank: forward_logprobs and one train_step of the real ActorEngine,
both engines alive in one process and timed alternately (A B A B), so load drift hits both alike.

    .venv/bin/python scripts/bench_zero_stage.py [--models small,medium] [--batch 16] [--max-len 256]
"""
import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="small,medium")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from vcppo.bench.train import long_tailed_batch
    from vcppo.driver.step.update import PolicyLoss
    from vcppo.runtime import dist
    from vcppo.engines.actor import ActorEngine
    from vcppo.models.factory import count_params, make_model
    from vcppo.config.schema import ActorConfig, AlgorithmConfig
    info = dist.init_distributed("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.models.split(","):
            path = os.path.join(tmp, size)
            n = count_params(make_model(size, None, path, max_position_embeddings=args.max_len + 64))
            actors = {s: ActorEngine(path, ActorConfig(lr=1e-6, micro_batch_size=8, zero_stage=s), info,
                                     total_optimizer_steps=100) for s in (3, 0)}
            batch = long_tailed_batch(args.batch, 16, args.max_len, seed=0)
            batch.old_logprobs, _ = actors[0].forward_logprobs(batch)
            loss = PolicyLoss(AlgorithmConfig())
            times = {(s, ph): [] for s in actors for ph in ("forward", "train_step")}
            for r in range(args.rounds + 1):  # round 0 is the warm-up
                for s, a in actors.items():
                    for ph, fn in (("forward", lambda: a.forward_logprobs(batch)),
                                   ("train_step", lambda: a.train_step(batch, loss))):
                        t = time.perf_counter()
                        fn()
                        if r:
                            times[(s, ph)].append(time.perf_counter() - t)
            for ph in ("forward", "train_step"):
                z3, z0 = statistics.median(times[(3, ph)]), statistics.median(times[(0, ph)])
                print(f"{size} ({n / 1e6:.1f}M) {ph}: ZeRO-3 {z3:.3f} s, ZeRO-0 {z0:.3f} s, "
                      f"ZeRO-3/ZeRO-0 = {z3 / z0:.2f}x  (medians of {args.rounds}, ABAB)", flush=True)
            for a in actors.values():
                a.close()
    dist.shutdown()


if __name__ == "__main__":
    main()
