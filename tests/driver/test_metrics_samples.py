"""logging.log_samples: a step's samples as text (driver/step/metrics.py), samples.jsonl, a wandb table
(wandb offline, for real), and `vcppo report`'s table of the last step's samples."""
import glob
import json

import torch

from vcppo.driver.step.metrics import pick_samples
from vcppo.experience import Rollout, last_token_rewards, make_layout
from vcppo.report import samples_markdown
from vcppo.tracking import MetricsLogger, last_samples


class Words:
    """A tokenizer that writes token i as 'w<i>'."""
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"w{i}" for i in ids)


def _rollout():
    layout = make_layout([[5], [6, 7]], [[8, 9, 10], [11]], pad_id=0)
    scores = torch.tensor([1.0, 0.0])
    return Rollout(**layout.layout_fields(), scores=scores,
                   token_rewards=last_token_rewards(scores, layout.policy_mask),
                   group=torch.tensor([0, 1]), correct=torch.tensor([1.0, 0.0]), truncated=torch.tensor([0.0, 1.0]))


def test_samples_are_the_prompt_and_response_text_with_their_scores():
    rollout = _rollout()
    adv = torch.tensor([[0.5, -1.0, 2.0], [3.0, 9.0, 9.0]])  # row 2's last two columns are padding
    first, second = pick_samples(rollout, rollout.token_rewards - 0.25 * rollout.policy_mask, adv, Words(), n=5)
    assert (first.prompt, first.response, first.length) == ("w5", "w8 w9 w10", 3)  # no padding in either
    assert (second.prompt, second.response, second.length) == ("w6 w7", "w11", 1)
    assert first.reward == 1.0 - 0.75 and first.score == 1.0 and first.correct and not first.truncated
    assert (first.adv_mean, first.adv_min, first.adv_max) == (0.5, -1.0, 2.0)
    assert (second.adv_mean, second.adv_max) == (3.0, 3.0) and second.truncated
    assert len(pick_samples(rollout, rollout.token_rewards, adv, Words(), n=1)) == 1


def test_samples_go_to_samples_jsonl_a_wandb_table_and_the_report(tmp_path):
    rollout = _rollout()
    records = [s.record() for s in pick_samples(rollout, rollout.token_rewards, torch.ones(2, 3), Words(), n=2)]
    log = MetricsLogger(tmp_path, {}, use_wandb=True, wandb_mode="offline", progress_bar=False, run_name="t")
    log.log({"x": 1.0}, step=1, phase="ppo")
    log.log_samples(records, step=1, phase="ppo")
    log.log_samples(records[:1], step=2, phase="ppo")
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["phase"], r["step"], r["response"]) for r in lines] == \
        [("ppo", 1, "w8 w9 w10"), ("ppo", 1, "w11"), ("ppo", 2, "w8 w9 w10")]
    tables = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" / "media" / "table" / "ppo" / "*.table.json"))
    assert len(tables) == 2
    table = json.loads(open(sorted(tables)[0]).read())
    assert "response" in table["columns"] and len(table["data"]) in (1, 2)
    assert last_samples(tmp_path) == (2, lines[2:])
    page = samples_markdown(tmp_path)
    assert "PPO step 2" in page and "| w5 | w8 w9 w10 | 1 | 1 | 3 |" in page


class _Engine:
    """A rollout engine that answers prompt i with 'answer <i>' (greedy and sampled alike)."""
    replica = 0

    def generate(self, ids, *, max_tokens, stop, logprobs, n, temperature, top_p, seed):
        from types import SimpleNamespace
        return [SimpleNamespace(prompt_index=i, text=f"answer {i}", response_ids=[1] * (i + 2),
                                finish_reason="stop") for i in range(len(ids)) for _ in range(n)]


class _Scorer:
    def judge(self, texts, truths, finish_reasons):
        ok = [t == f"answer {truth}" for t, truth in zip(texts, truths)]
        return [float(x) for x in ok], ok


def test_validation_hands_its_greedy_samples_to_samples_jsonl(tmp_path):
    from types import SimpleNamespace

    from vcppo.config.load import load_config
    from vcppo.driver.step.metrics import log_validations
    from vcppo.driver.step.sampler import make_sampler
    from vcppo.driver.step.validation import SAMPLES_KEY, validate_run
    from vcppo.runtime.dist import DistInfo
    dist = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", is_main=True)
    rows = [{"prompt_ids": [3], "prompt": "q0", "answer": 0}, {"prompt_ids": [4], "prompt": "q1", "answer": 5}]
    cfg = load_config("vcppo", ["logging.log_samples=1", "trainer.val_k=[1]", "trainer.val_n_samples=1"])
    metrics = validate_run(cfg, make_sampler(cfg, _Engine(), _Scorer()), rows, dist, step=3)
    assert metrics["val/pass@1_greedy"] == 0.5 and metrics[SAMPLES_KEY] == [
        {"prompt": "q0", "answer": "0", "response": "answer 0", "reward": 1.0, "score": 1.0, "correct": True, "truncated": False,
         "length": 2, "adv_mean": None, "adv_min": None, "adv_max": None}]
    off = load_config("vcppo", ["trainer.val_k=[1]", "trainer.val_n_samples=1"])
    assert SAMPLES_KEY not in validate_run(off, make_sampler(off, _Engine(), _Scorer()), rows, dist, step=3)

    log = MetricsLogger(tmp_path, {}, use_wandb=False, progress_bar=False)
    source = SimpleNamespace(finished_validations=lambda wait: [(3, dict(metrics))])
    log_validations(SimpleNamespace(log=log, write_final_metrics=lambda m: None), source)
    log.close()
    assert [json.loads(x)["phase"] for x in (tmp_path / "samples.jsonl").read_text().splitlines()] == ["val"]
    assert SAMPLES_KEY not in json.loads((tmp_path / "metrics.jsonl").read_text())  # not a metric
