"""The README's "First run on a GPU" block, run as it is on the CPU: the model and the data sets by
their hub ids from a Hugging Face cache (a real cache layout, offline) where the tiny test model
stands in for Qwen2.5-0.5B-Instruct; sizes appended for the CPU. Then `vcppo plan` by model id."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ENV, REPO
from tests.hub_cache import add_model, add_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
CPU_SIZES = {  # appended to the README's lines: a CPU-sized run of the same preset
    "train": ["trainer.total_steps=2", "trainer.prompts_per_step=4", "rollout.max_response_tokens=16",
              "value_pretrain.steps=2", "trainer.val_every=2", "trainer.save_every=2",
              "trainer.val_max_prompts=4", "rollout.gpu_memory_utilization=null"],
    "eval": ["eval.n_samples=2", "eval.k=[1,2]", "rollout.max_response_tokens=16", "data.max_prompt_tokens=512",
             "rollout.gpu_memory_utilization=null"],
}


def readme_block() -> list[list[str]]:
    """The `vcppo` lines of the README's first-run block, as argv lists."""
    text = (Path(REPO) / "README.md").read_text()
    block = re.search(r"## First run on a GPU.*?```bash\n(.*?)```", text, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.startswith("vcppo ")]


def _parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def warm_cache(hf_home: Path, tiny: Path, tmp: Path) -> None:
    """The hub cache a user who downloaded the model and the four data sets has (upstream schemas)."""
    add_model(hf_home, MODEL, tiny)
    gsm = [{"question": f"Tom has {a} apples and buys {b} more. How many now?",
            "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b}.\n#### {a + b}"} for a in range(1, 5) for b in range(1, 5)]
    add_snapshot(hf_home, "openai/gsm8k", {
        "main/train-00000-of-00001.parquet": _parquet(tmp / "gsm_train.parquet", gsm[:12]),
        "main/test-00000-of-00001.parquet": _parquet(tmp / "gsm_test.parquet", gsm[12:]),
        "socratic/test-00000-of-00001.parquet": _parquet(tmp / "gsm_soc.parquet", gsm[:2]),
        "README.md": "# gsm8k"}, repo_type="dataset")
    math500 = [{"problem": f"What is ${i}+{i}$?", "solution": f"$\\boxed{{{2 * i}}}$", "answer": str(2 * i),
                "subject": "Algebra", "level": 1, "unique_id": f"test/algebra/{i}.json"} for i in range(3)]
    (tmp / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in math500))
    add_snapshot(hf_home, "HuggingFaceH4/MATH-500", {"test.jsonl": tmp / "math500.jsonl"}, repo_type="dataset")
    for repo, year in (("HuggingFaceH4/aime_2024", 2024), ("yentinglin/aime_2025", 2025)):
        rows = [{"id": i, "problem": f"Find {i} times 7.", "solution": "...", "answer": str(7 * i), "url": "",
                 "year": year} for i in range(1, 3)]
        add_snapshot(hf_home, repo, {"data/train-00000-of-00001.parquet": _parquet(tmp / f"aime{year}.parquet", rows)},
                     repo_type="dataset")


def offline_hub(tiny_artifacts: Path, tmp_path: Path) -> tuple[Path, dict]:
    """HF_HOME with the warm cache, and the tests' environment reading it offline."""
    hf_home = tmp_path / "hf"
    warm_cache(hf_home, tiny_artifacts / "tiny", tmp_path)
    return hf_home, dict(ENV, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", PYTHONPATH=REPO)


def model_snapshot(hf_home: Path) -> Path:
    return next((hf_home / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots").iterdir())


def run(argv: list[str], cwd: Path, env: dict) -> str:
    res = subprocess.run([sys.executable, "-m", "vcppo.cli", *argv], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, f"{shlex.join(argv)} exited {res.returncode}:\n{res.stderr[-3000:]}"
    return res.stdout + res.stderr


def test_the_readme_first_run_block_runs_offline_by_model_id(tiny_artifacts, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    hf_home, env = offline_hub(tiny_artifacts, tmp_path)
    lines = readme_block()
    assert [a[:2] for a in lines] == [["vcppo", "data"]] * 2 + [["vcppo", "train"], ["vcppo", "eval"]]
    outputs = [run(argv[1:] + CPU_SIZES.get(argv[1], []), work, env) for argv in lines]

    train = pd.read_parquet(work / "data" / "gsm8k" / "train.parquet")
    assert len(train) == 12 and set(train["data_source"]) == {"openai/gsm8k"}
    assert train["prompt"][0][0]["content"].endswith('output the final answer after "####".')
    assert train["reward_model"][0]["ground_truth"] == "2"
    assert len(pd.read_parquet(work / "data" / "gsm8k" / "test.parquet")) == 4  # main's test split, not socratic's

    run_dir = work / "runs" / "gsm8k_ppo-seed0"
    snapshot = model_snapshot(hf_home)
    history = [json.loads(line) for line in (run_dir / "config_history.jsonl").read_text().splitlines()]
    assert history[0]["models"]["model.policy_path"] == f"{MODEL}@{snapshot.name}"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "critic/value_loss" in m][-1] == 2
    assert any("val/pass@1_greedy" in m for m in metrics)
    assert f"model.policy_path={MODEL} -> {snapshot}" in outputs[2]

    evaluated = outputs[3]
    for source, n in (("openai/gsm8k", 4), ("HuggingFaceH4/MATH-500", 3), ("aime2024", 2), ("aime2025", 2)):
        assert re.search(rf"\| {re.escape(source)} \| {n} \|", evaluated), (source, evaluated[-2000:])
    assert "2 samples per prompt for pass@k" in evaluated


@pytest.mark.extended
def test_eval_reads_the_model_by_id(tiny_artifacts, tmp_path):
    """`vcppo eval MODEL_ID`: the same resolver as the first-run block's `vcppo train ...
    model.policy_path=MODEL_ID` (above, in `make test`), through eval's own key."""
    hf_home, env = offline_hub(tiny_artifacts, tmp_path)
    out = run(["eval", MODEL, "--benchmark", "gsm8k", "eval.n_samples=0", *CPU_SIZES["eval"][2:]], tmp_path, env)
    snapshot = model_snapshot(hf_home)
    assert f"eval.model_path={MODEL} -> {snapshot}" in out and re.search(r"\| all \| 4 \|", out), out[-2000:]


def test_plan_reads_the_model_by_id_and_names_a_missing_one(tiny_artifacts, tmp_path):
    _, env = offline_hub(tiny_artifacts, tmp_path)
    out = run(["plan", "gsm8k_ppo", "--gpus-per-node", "1"], tmp_path, env)
    assert "Verdict: fits as configured" in out and ", 0.5 M params" in out  # the cached (tiny) config.json
    res = subprocess.run([sys.executable, "-m", "vcppo.cli", "plan", "gsm8k_ppo", "model.policy_path=Qwen/Missing"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert "config key 'model.policy_path': Qwen/Missing is not a local path and not in the Hugging Face cache" \
        in res.stderr and "hf download Qwen/Missing" in res.stderr
