"""`vcppo plan`'s memory figures against one real actor train step on CPU (fp32, one rank, ZeRO
stage auto = 0), for the tiny and small model sizes, with and without gradient checkpointing.

    .venv/bin/python scripts/plan_vs_measured.py [--sizes tiny,small] [--batch 8] [--prompt 64] [--response 960]

What is measured: the peak resident set size of the process (the kernel's VmHWM) during one
``ActorEngine.train_step`` on a batch of ``--batch`` full-length sequences (one micro-batch), minus
the resident size just before it. VmHWM is exact (no sampling thread to miss a short peak) and
counts torch's CPU tensors, which tracemalloc does not see (torch allocates outside Python's
allocator); it is reset before the step by writing 5 to /proc/self/clear_refs (Linux >= 4.0), so an
earlier peak (model loading) cannot hide the step's. glibc would keep freed blocks in its heap and
let RSS overstate what is live, so the script re-executes itself with MALLOC_MMAP_THRESHOLD_ fixed
at 64 KiB: every tensor of that size or more is its own mapping, returned to the kernel when freed.
A warm-up step first creates the Adam states, so the measured step's growth is its activations
plus the gradients DeepSpeed re-creates in backward (predicted: activations + 4 bytes/param).
The model states (16 bytes/param in fp32) are compared too: RSS after the warm-up step minus RSS
before the engine was built; at these sizes (2-8 MB) that is within the noise of DeepSpeed's own
start-up allocations, so only the activation figures test anything.
"""
import argparse
import gc
import os
import sys
import tempfile

if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":  # see the docstring; must be set before start-up
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)

import torch  # noqa: E402


from vcppo.driver.step.timeline import PeakRss, proc_status_bytes  # noqa: E402


def status_kib(field: str) -> int:
    value = proc_status_bytes(field)
    if value is None:
        raise KeyError(field)
    return value // 1024


class TokenLoss:
    """Mean NLL over response tokens (the engine's loss interface, EngineLoss)."""
    needs_entropy = False

    def count_masks(self, minibatch):
        from vcppo.engines.loss_contract import response_counts
        return response_counts(minibatch)

    def __call__(self, outputs, micro, counts):
        from vcppo.engines.loss_contract import RESPONSE
        loss = (-outputs.logprobs * micro.policy_mask).sum() / counts.tokens[RESPONSE]
        return loss, {}


def batch(n: int, prompt: int, response: int, vocab: int, seed: int = 0):
    from vcppo.experience import make_layout
    g = torch.Generator().manual_seed(seed)
    ids = lambda k: torch.randint(4, vocab - 1, (k,), generator=g).tolist()  # noqa: E731
    return make_layout([ids(prompt) for _ in range(n)], [ids(response) for _ in range(n)], pad_id=0)


def measure(size: str, checkpointing: bool, args, info, tmp: str) -> dict:
    from vcppo.engines.actor import ActorEngine
    from vcppo.models.factory import make_model
    from vcppo.plan.memory import activations, model_states
    from vcppo.models.shapes import read_shape
    from vcppo.config.schema import ActorConfig

    path = os.path.join(tmp, size)
    if not os.path.isdir(path):
        make_model(size, None, path, max_position_embeddings=args.prompt + args.response + 64)
    shape = read_shape(path, "model.policy_path")
    gc.collect()
    rss_start = status_kib("VmRSS")
    cfg = ActorConfig(lr=1e-4, micro_batch_size=args.batch, grad_clip=0.0, gradient_checkpointing=checkpointing)
    actor = ActorEngine(path, cfg, info, total_optimizer_steps=10)
    actor.train_step(batch(1, 4, 4, shape.vocab_size, seed=1), TokenLoss())  # creates the Adam states
    gc.collect()
    rss_states = status_kib("VmRSS")
    big = batch(args.batch, args.prompt, args.response, shape.vocab_size)
    PeakRss.reset()
    rss_before = status_kib("VmRSS")
    actor.train_step(big, TokenLoss())
    peak = status_kib("VmHWM")
    actor.close()
    tokens = args.batch * (args.prompt + args.response)
    predicted_acts = activations(shape, tokens, args.batch * args.response, 4, checkpointing=checkpointing).total_bytes
    predicted_step = predicted_acts + 4 * shape.params
    states = model_states(shape.params, shape.largest_module_params, 1, 0, 4, True)
    return {"size": size, "params": shape.params, "ckpt": checkpointing, "tokens": tokens,
            "step_pred": predicted_step / 2 ** 20, "step_meas": (peak - rss_before) / 1024,
            "states_pred": states.resident_bytes / 2 ** 20, "states_meas": (rss_states - rss_start) / 1024}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=960)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from vcppo.runtime import dist
    info = dist.init_distributed("cpu")
    print("| size | params | grad ckpt | tokens | step peak predicted MiB | measured MiB | error "
          "| states predicted MiB | measured MiB |\n|---|---:|---|---:|---:|---:|---:|---:|---:|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            for ckpt in (False, True):
                r = measure(size, ckpt, args, info, tmp)
                error = r["step_pred"] / r["step_meas"] - 1
                print(f"| {r['size']} | {r['params']:,} | {r['ckpt']} | {r['tokens']:,} | {r['step_pred']:.1f} "
                      f"| {r['step_meas']:.1f} | {error:+.1%} | {r['states_pred']:.1f} | {r['states_meas']:.1f} |",
                      flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
