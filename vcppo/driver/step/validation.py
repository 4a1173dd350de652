"""Greedy pass@1 and sampled unbiased pass@k of the rollout engine's policy on a prompt split:
validation inside training, the SFT command's stopping rule, and `vcppo eval`."""
from __future__ import annotations

import time

import numpy as np

from vcppo.algos.stats import pass_at_k
from vcppo.driver.step.experience_maker import sample_seed
from vcppo.driver.step.sampler import Sampler, Scored, rollout_share
from vcppo.runtime import collectives
from vcppo.runtime.dist import DistInfo
from vcppo.config.schema import Config, RolloutConfig


def _score_on_rank(sampler: Sampler, mine: list[dict], sampling: RolloutConfig, n_samples: int, ks: list[int],
                   seed: int, greedy: bool, keep: range, first: int, text_samples: int = 0) -> dict:
    """Metrics of the rows in ``keep`` (indices into ``mine``, the rows this rank's rollout group
    samples: the whole group sends the same requests, each rank keeps its part); each entry's
    row, as an index into the whole split (``first``: the index of ``mine[0]``), in ``*_rows``;
    ``text_samples`` greedy responses as text in ``samples``. A sample is the ``sampler``'s (a
    single response, or a multi-turn episode whose length is its model tokens)."""
    part = {"greedy_correct": [], "greedy_lengths": [], "greedy_rows": [], "n_correct": [], "n_correct_rows": [],
            "sampled_lengths": [], "sampled_rows": [], "samples": [], "greedy_tools": [], "sampled_tools": []}
    if not mine:
        return part
    if greedy:
        out = sampler.validation_samples(mine, keep, 1, 0.0, 1.0, seed)
        part["greedy_correct"] = [float(s.correct) for s in out]
        part["greedy_lengths"] = [s.length for s in out]
        part["greedy_rows"] = [first + s.row for s in out]
        part["greedy_tools"] = [s.tool_calls for s in out if s.tool_calls is not None]
        part["samples"] = [_text_sample(mine[s.row], s) for s in out[:text_samples]]
    if n_samples > 0 and ks:
        out = sampler.validation_samples(mine, keep, n_samples, sampling.temperature, sampling.top_p, seed + 1)
        counts = [0] * len(mine)
        for s in out:
            counts[s.row] += int(s.correct)
        part["n_correct"] = [counts[i] for i in keep]
        part["n_correct_rows"] = [first + i for i in keep]
        part["sampled_lengths"] = [s.length for s in out]
        part["sampled_rows"] = [first + s.row for s in out]
        part["sampled_tools"] = [s.tool_calls for s in out if s.tool_calls is not None]
    return part


def _text_sample(row: dict, sample: Scored) -> dict:
    """A greedy validation response as a record of samples.jsonl (no advantages: nothing trains on it)."""
    correct = float(sample.correct)
    return {"prompt": str(row.get("prompt", "")), "answer": str(row.get("answer", "")), "response": sample.text,
            "reward": correct, "score": correct,
            "correct": sample.correct, "truncated": sample.truncated,
            "length": sample.length, "adv_mean": None, "adv_min": None, "adv_max": None}


def evaluate(sampler: Sampler, rows: list[dict], *, dist: DistInfo, sampling: RolloutConfig, n_samples: int,
             ks: list[int], seed: int = 0, greedy: bool = True, groups: list[str] | None = None,
             text_samples: int = 0) -> dict:
    """Each rank evaluates its slice of ``rows`` ({"prompt_ids", "answer"}) with the ``sampler``'s
    samples (:func:`~vcppo.driver.step.sampler.make_sampler`); results are merged.

    Returns ``val/pass@1_greedy`` (temperature 0), ``val/pass@k`` for each k (unbiased estimator
    over ``n_samples`` samples at ``sampling.temperature``), mean response lengths, and on episodes
    the share of greedy / sampled episodes that called a tool (``val/tool_use_*``); with
    ``groups`` (a label per row, e.g. its data_source) the same per group, as ``val/<group>/...``.
    """
    sampled, kept = rollout_share(len(rows), dist, sampling.tensor_parallel_size)
    part = _score_on_rank(sampler, rows[sampled.start:sampled.stop], sampling, n_samples, ks, seed, greedy,
                          keep=kept, first=sampled.start, text_samples=text_samples)
    merged = {k: [] for k in part}
    for p in collectives.all_gather_object(part):
        for k, v in p.items():
            merged[k] += v
    res = _summary(merged, len(rows), n_samples, ks, greedy, "val/")
    if text_samples:  # not a metric: log_validations writes them to samples.jsonl
        res[SAMPLES_KEY] = merged["samples"][:text_samples]
    for label in dict.fromkeys(groups or []):
        mine = {i for i, g in enumerate(groups) if g == label}
        picked = {k: [v for v, r in zip(merged[k], merged[_ROWS[k]]) if r in mine] for k in _ROWS}
        res.update(_summary(picked, len(mine), n_samples, ks, greedy, f"val/{label}/"))
    return res


SAMPLES_KEY = "samples"  # validate_run's greedy responses as text (logging.log_samples), beside the metrics


def validate_run(cfg: Config, sampler: Sampler, rows: list[dict], dist: DistInfo, step: int) -> dict:
    """A training run's validation with the weights of ``step`` (``trainer.val_*``, seeded per step
    and rollout engine): :func:`evaluate`'s metrics and ``time/val_s``, its wall-clock seconds."""
    start = time.perf_counter()
    metrics = evaluate(sampler, rows, dist=dist, sampling=cfg.rollout, n_samples=cfg.trainer.val_n_samples,
                       ks=cfg.trainer.val_k, seed=sample_seed(cfg.trainer.seed, "val", step, sampler.rollout.replica),
                       text_samples=cfg.logging.log_samples)
    metrics["time/val_s"] = time.perf_counter() - start
    return metrics


# the per-row list that says which row each entry of a merged list belongs to
_ROWS = {"greedy_correct": "greedy_rows", "greedy_lengths": "greedy_rows", "n_correct": "n_correct_rows",
         "sampled_lengths": "sampled_rows", "greedy_tools": "greedy_rows", "sampled_tools": "sampled_rows"}


def _summary(merged: dict, n_rows: int, n_samples: int, ks: list[int], greedy: bool, prefix: str) -> dict:
    res = {f"{prefix}num_prompts": float(n_rows)}
    if greedy:
        res[f"{prefix}pass@1_greedy"] = float(np.mean(merged["greedy_correct"]))
        res[f"{prefix}response_length_greedy"] = float(np.mean(merged["greedy_lengths"]))
    if merged["n_correct"]:
        res[f"{prefix}response_length_sampled"] = float(np.mean(merged["sampled_lengths"]))
        for k in ks:
            res[f"{prefix}pass@{k}"] = float(np.mean([pass_at_k(n_samples, c, k) for c in merged["n_correct"]]))
    # episodes: the share that called a tool at least once (an env without tools reports 0)
    for key, name in (("greedy_tools", "tool_use_greedy"), ("sampled_tools", "tool_use_sampled")):
        if merged.get(key):
            res[f"{prefix}{name}"] = float(np.mean([c > 0 for c in merged[key]]))
    return res
