"""`vcppo bench episodes`: model tokens/s of K-turn episodes against one-turn samples of the same
model tokens, on the same vLLM engine, in one run (alternated ABAB: the machine is shared).

An episode's turns are ``--turn-tokens`` long (the random factory model rarely ends a turn early)
and a bench env answers each with a short observation after ``--env-latency-ms`` (in the env worker
pool, ``--workers`` processes: a turn's env steps run side by side, so the latency is paid once per
turn, not once per episode). The one-turn samples are ``--turns x --turn-tokens`` long. The figure:
model tokens per second of each, and episodes / one-turn.

    vcppo bench episodes [--size small] [--prompts 32 --n 2] [--turns 4 --turn-tokens 32]
                         [--env-latency-ms 0,50] [--workers 2] [--rounds 2] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import sys
import time


class FixedTurnsEnv:
    """Answers every turn with ``"ok"`` after ``latency_ms``; the episode ends after ``turns`` turns."""

    def __init__(self, turns: int = 4, latency_ms: float = 0.0):
        self.turns, self.latency_s, self.turn = int(turns), float(latency_ms) / 1000, 0

    def reset(self, row: dict, seed: int) -> tuple[str, dict]:
        self.turn = 0
        return "", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.turn += 1
        if self.latency_s:
            time.sleep(self.latency_s)
        return "ok", 0.0, self.turn >= self.turns, False, {}


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vcppo bench episodes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model dir (default: a factory model of --size)")
    ap.add_argument("--size", default="small")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=32)
    ap.add_argument("--env-latency-ms", default="0,50", help="comma list: one episode figure per latency")
    ap.add_argument("--workers", type=int, default=2, help="env worker processes (0: in this process)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def _runner(args, rollout, latency_ms: float):
    from vcppo.driver.step.multi_turn import episode_runner
    from vcppo.config.schema import Config

    cfg = Config()
    r = cfg.rollout
    r.env, r.env_args = f"{__name__}:FixedTurnsEnv", {"turns": args.turns, "latency_ms": latency_ms}
    r.max_turns, r.turn_max_tokens = args.turns, args.turn_tokens
    r.max_response_tokens = args.turns * (args.turn_tokens + 16)
    r.env_timeout_s = 30.0
    return episode_runner(cfg, rollout, args.workers, max_model_len=args.prompt_len + r.max_response_tokens)


def _one_turn(rollout, prompts, args, seed) -> tuple[float, float]:
    t = time.perf_counter()
    out = rollout.generate(prompts, n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.turns * args.turn_tokens,
                           seed=seed, logprobs=False)
    return float(sum(len(s.response_ids) for s in out)), time.perf_counter() - t


def _episodes(runner, rows, args, seed) -> tuple[float, float, float]:
    t, env0 = time.perf_counter(), runner.env_seconds
    done = runner.run(rows, args.n, seed, "bench", temperature=1.0, logprobs=False)
    return float(sum(sum(e.policy) for e in done)), time.perf_counter() - t, runner.env_seconds - env0


def main(argv=None) -> dict:
    args = _parse(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import tempfile

    import torch

    from vcppo.bench import write_json
    from vcppo.runtime import dist
    from vcppo.engines.rollout import RolloutEngine
    from vcppo.models.factory import make_model
    from vcppo.config.schema import RolloutConfig
    from vcppo.tracking import machine_info

    info = dist.init_distributed("auto")
    model = args.model
    if model is None:  # a factory model with vcppo's char tokenizer (= `vcppo model make --size SIZE`)
        model = tempfile.mkdtemp(prefix="vcppo_bench_episodes_")
        make_model(args.size, None, model)
    latencies = [float(x) for x in str(args.env_latency_ms).split(",") if x != ""]
    max_len = args.prompt_len + args.turns * (args.turn_tokens + 16)
    rollout = RolloutEngine(model, RolloutConfig(gpu_memory_utilization=0.05), info, seed=0, max_model_len=max_len)
    g = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(5, 80, (args.prompt_len,), generator=g)] for _ in range(args.prompts)]
    rows = [{"prompt_ids": p, "answer": "0"} for p in prompts]
    runners = {lat: _runner(args, rollout, lat) for lat in latencies}
    _one_turn(rollout, prompts, args, seed=0)  # warm-up of the engine
    totals: dict = {"one_turn": [0.0, 0.0]} | {f"episodes_{lat:g}ms": [0.0, 0.0, 0.0] for lat in latencies}
    for rnd in range(args.rounds):
        tok, sec = _one_turn(rollout, prompts, args, seed=rnd + 1)
        totals["one_turn"][0] += tok
        totals["one_turn"][1] += sec
        for lat, runner in runners.items():
            tok, sec, env = _episodes(runner, rows, args, seed=rnd + 1)
            key = f"episodes_{lat:g}ms"
            totals[key] = [totals[key][0] + tok, totals[key][1] + sec, totals[key][2] + env]
    base = totals["one_turn"][0] / totals["one_turn"][1]
    res = {"host": machine_info(), "model": model, "prompts": args.prompts, "n": args.n, "turns": args.turns,
           "turn_tokens": args.turn_tokens, "workers": args.workers, "rounds": args.rounds,
           "one_turn_tok_per_s": base}
    print(f"one turn of {args.turns * args.turn_tokens} tokens: {base:.0f} model tok/s", flush=True)
    for lat in latencies:
        tok, sec, env = totals[f"episodes_{lat:g}ms"]
        res[f"episodes_{lat:g}ms_tok_per_s"] = tok / sec
        res[f"episodes_{lat:g}ms_over_one_turn"] = tok / sec / base
        res[f"episodes_{lat:g}ms_env_share"] = env / sec
        print(f"{args.turns} turns x {args.turn_tokens} tokens, env latency {lat:g} ms: {tok / sec:.0f} model tok/s "
              f"= {tok / sec / base:.2f}x one turn (env wait {env / sec:.0%} of the time)", flush=True)
    for runner in runners.values():
        runner.envs.close()
    rollout.close()
    dist.shutdown()
    write_json(args.json, res)
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
