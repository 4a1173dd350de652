"""`vcppo eval MODEL_DIR DATA`: any Hugging Face causal-LM directory, any prompt file
of the supported formats (plain parquet / jsonl with prompt and answer, verl-format parquet / jsonl
with chat-message prompts and reward_model.ground_truth); the config form keeps working; a missing
directory or file, a directory that is not a causal LM, an unsupported format is one line naming it.

Everything but the last test runs without an engine (errors are raised before any starts; the
scoring path runs with a stand-in for vLLM); the last one (`make test-extended`) runs the real command
(vLLM CPU) on a `vcppo model make` dir with a trained BPE tokenizer and a `vcppo data make --format verl`
file."""
import json
import re
import shutil

import pytest

from tests.conftest import vcppo
from vcppo.cli import main
from vcppo.commands import evaluate
from vcppo.engines.rollout import RolloutSample


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_any")
    small = ["--task", "add", "--difficulty", "2"]
    assert main(["data", "make", *small, "--out", str(root / "verl"), "--n", "8", "--n-eval", "6", "--format", "verl"]) == 0
    assert main(["data", "make", *small, "--split", "test", "--out", str(root / "verl.jsonl"), "--n", "6",
                 "--format", "verl"]) == 0
    assert main(["data", "make", *small, "--split", "test", "--out", str(root / "plain.jsonl"), "--n", "6"]) == 0
    assert main(["data", "make", *small, "--split", "test", "--out", str(root / "plain.parquet"), "--n", "6"]) == 0
    assert main(["model", "tokenizer", "--out", str(root / "bpe"), "--bpe", "--vocab-size", "300"]) == 0
    assert main(["model", "make", "--size", "tiny", "--out", str(root / "model"), "--tokenizer", str(root / "bpe"),
                 "--untied"]) == 0
    # the same model without a chat template (a base model), and a value model (not a causal LM)
    shutil.copytree(root / "model", root / "base_model")
    (root / "base_model" / "chat_template.jinja").unlink()
    cfg = json.loads((root / "base_model" / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (root / "base_model" / "tokenizer_config.json").write_text(json.dumps(cfg))
    from vcppo.models.value_model import ValueModel
    ValueModel.from_policy(str(root / "model")).save_pretrained(str(root / "rm"), tokenizer_src=str(root / "model"))
    (root / "prompts.csv").write_text("prompt,answer\n1+1=?,2\n")
    return root


def _fails(capsys, *argv):
    assert main(["eval", *map(str, argv)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_bad_arguments_are_one_line_naming_them(art, capsys):
    m, d = art / "model", art / "verl" / "test.parquet"
    assert f"MODEL_DIR: model directory not found: {art / 'nope'}" in _fails(capsys, art / "nope", d)
    assert f"DATA: data file not found: {art / 'nope.parquet'}" in _fails(capsys, m, art / "nope.parquet")
    assert "DATA: unsupported data format" in _fails(capsys, m, art / "prompts.csv")
    assert "prompts.csv" in _fails(capsys, m, art / "prompts.csv")
    assert f"{art / 'bpe'} has no config.json" in _fails(capsys, art / "bpe", d)  # a tokenizer dir
    assert f"{art / 'rm'} is a vcppo value / reward model" in _fails(capsys, art / "rm", d)
    assert f"{art / 'verl'} is a directory but not a datasets save_to_disk directory" in _fails(capsys, m, art / "verl")
    assert "DATA is missing after MODEL_DIR" in _fails(capsys, m)
    assert "eval.data_files is given twice" in _fails(capsys, m, d, f"eval.data_files={d}")
    # the config form names its keys
    assert "config key 'eval.model_path'" in _fails(capsys, "base", f"eval.model_path={art / 'bpe'}",
                                                    f"eval.data_files={d}")
    assert "config key 'eval.data_files': unsupported data format" in _fails(
        capsys, f"eval.model_path={m}", f"eval.data_files={art / 'prompts.csv'}")
    # chat-message prompts need a chat template: named with the model, before any engine starts
    err = _fails(capsys, art / "base_model", d)
    assert "chat template" in err and str(art / "base_model") in err


def test_argument_forms(art):
    m, d = str(art / "model"), str(art / "plain.jsonl")
    assert evaluate.eval_argv([m, d, "eval.k=[1]"]) == ["base", f"eval.model_path={m}", f"eval.data_files={d}",
                                                        "eval.k=[1]"]
    assert evaluate.eval_argv(["grpo", m, d])[:3] == ["grpo", f"eval.model_path={m}", f"eval.data_files={d}"]
    config_form = ["base", f"eval.model_path={m}", f"eval.data_files={d}"]
    assert evaluate.eval_argv(config_form) == config_form and evaluate.eval_argv(config_form[1:]) == config_form[1:]


def test_benchmark_argument_forms(art):
    m, d = str(art / "model"), str(art / "verl" / "test.parquet")
    bench = ['eval.benchmark="gsm8k"', "eval.max_prompts=null"]
    assert evaluate.eval_argv(["Qwen/Qwen2.5-0.5B-Instruct", "--benchmark", "gsm8k"]) == \
        ["base", "eval.model_path=Qwen/Qwen2.5-0.5B-Instruct", *bench]
    assert evaluate.eval_argv(["grpo", m, "--benchmark=gsm8k"]) == ["grpo", f"eval.model_path={m}", *bench]
    assert evaluate.eval_argv([m, d, "--benchmark", "gsm8k"]) == ["base", f"eval.model_path={m}",
                                                                  f"eval.data_files={d}", *bench]
    assert evaluate.eval_argv(["gsm8k_ppo", "--benchmark", "aime24", "eval.max_prompts=5"]) == \
        ["gsm8k_ppo", "eval.max_prompts=5", 'eval.benchmark="aime24"']  # a preset: its model.policy_path
    with pytest.raises(evaluate.ConfigError, match="--benchmark needs a name"):
        evaluate.eval_argv([m, "--benchmark"])
    with pytest.raises(evaluate.ConfigError, match="eval.model_path is given twice"):
        evaluate.eval_argv([m, "--benchmark", "gsm8k", f"eval.model_path={m}"])


@pytest.mark.parametrize("argv,says", [
    (["--benchmark", "gsm8k"], "MODEL is missing"),  # not a download hint for the preset's default policy
    (["/typo", "--benchmark", "gsm8k"], "MODEL: model directory not found: /typo"),  # not "no such preset"
    (["--benchmark", ","], "--benchmark needs a name .* got ','"),
    (["--benchmark", ""], "--benchmark needs a name .* got ''"),  # not "Incompatible value 'None'"
])
def test_benchmark_mistakes_are_named(argv, says):
    with pytest.raises(evaluate.ConfigError, match=says):
        evaluate.eval_argv(argv)


def test_eval_help_documents_benchmark(capsys):
    from vcppo.cli import main
    assert main(["eval", "--help"]) == 0
    assert "--benchmark NAMES" in capsys.readouterr().out


@pytest.mark.parametrize("name,expected", [
    ("verl/test.parquet", "reward_model.ground_truth"), ("verl.jsonl", "reward_model.ground_truth"),
    ("plain.parquet", "answer"), ("plain.jsonl", "answer")])
def test_the_answer_field_of_a_verl_file_is_found(art, name, expected):
    assert evaluate.resolve_answer_field(str(art / name), "answer") == expected
    assert evaluate.resolve_answer_field(str(art / name), "solution") == "solution"  # a setting is kept


class AddingRollout:
    """Stands in for vLLM: reads the sum off each prompt; greedy answers right, sample 0 right and
    sample 1 wrong (pass@1 0.5, pass@2 1.0 when the answers reach the scorer)."""
    def __init__(self, model_path, *args, **kwargs):
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(model_path)

    def generate(self, prompt_token_ids, n, temperature, **kw):
        out = []
        for i, ids in enumerate(prompt_token_ids):
            a, b = map(int, re.findall(r"(\d+)\+(\d+)=\?", self.tok.decode(ids))[-1])
            for j in range(n):
                answer = a + b + (j if temperature > 0 else 0)
                out.append(RolloutSample(i, list(ids), [1, 2], [0.0, 0.0], "stop",
                                         f"<think>\n</think>\n\\boxed{{{answer}}}<|im_end|>"))
        return out

    def close(self, final=False):
        pass


@pytest.mark.parametrize("name", ["verl/test.parquet", "verl.jsonl", "plain.parquet", "plain.jsonl"])
def test_every_format_reaches_the_scorer(art, name, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(evaluate, "make_rollout_engine", AddingRollout)
    out = tmp_path / "not_yet" / "m.json"  # a folder that does not exist yet is made, not a lost evaluation
    assert main(["eval", str(art / "model"), str(art / name), "eval.n_samples=2", "eval.k=[1,2]",
                 "reward.num_workers=0", f"eval.output_json={out}"]) == 0
    # a verl file's answers come from reward_model.ground_truth without data.answer_field, and it says so
    assert ("reading the answer from reward_model.ground_truth" in capsys.readouterr().out) == name.startswith("verl")
    m = json.loads(out.read_text())
    assert m["val/num_prompts"] == 6 and m["val/pass@1_greedy"] == 1.0
    assert m["val/pass@1"] == 0.5 and m["val/pass@2"] == 1.0


def test_samples_jsonl_holds_every_greedy_response(art, monkeypatch, tmp_path):
    monkeypatch.setattr(evaluate, "make_rollout_engine", AddingRollout)
    out, samples = tmp_path / "m.json", tmp_path / "new" / "samples.jsonl"
    assert main(["eval", str(art / "model"), str(art / "plain.parquet"), "eval.n_samples=2", "eval.k=[1,2]",
                 "reward.num_workers=0", f"eval.output_json={out}", f"eval.samples_jsonl={samples}"]) == 0
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(records) == 6 and all(r["correct"] for r in records)
    assert {"prompt", "response", "correct", "length"} <= set(records[0]) and records[0]["response"]
    assert "samples" not in json.loads(out.read_text())  # the metrics file holds metrics only


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.extended
def test_eval_a_model_make_dir_on_a_verl_file(art, tmp_path):
    """The real command, vLLM CPU: a random untied BPE model answers nothing right, but the whole
    path runs (the answers come from reward_model.ground_truth without data.answer_field).
    A second case of paths `make test` runs for real elsewhere: `vcppo eval MODEL_DIR DATA` with vLLM
    (tests/driver/test_conversion_export_e2e.py), a BPE model on verl-format data through vLLM
    (tests/driver/test_bpe_e2e.py), an untied model in vLLM (tests/engines/test_engines.py); the
    answer read from reward_model.ground_truth: test_every_format_reaches_the_scorer above."""
    out = tmp_path / "m.json"
    res = vcppo("eval", art / "model", art / "verl" / "test.parquet", "eval.max_prompts=4", "eval.n_samples=2",
                "eval.k=[1,2]", "rollout.max_response_tokens=16", f"eval.output_json={out}", cwd=tmp_path,
                check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "reading the answer from reward_model.ground_truth" in res.stdout
    m = json.loads(out.read_text())
    assert m["val/num_prompts"] == 4 and {"val/pass@1_greedy", "val/pass@1", "val/pass@2"} <= set(m)
    assert m["val/response_length_greedy"] <= 16


class OddSumsWrongRollout(AddingRollout):
    """Greedy answers right only where the sum is even: each file gets its own greedy pass@1."""
    def generate(self, prompt_token_ids, n, temperature, **kw):
        out = super().generate(prompt_token_ids, n, temperature, **kw)
        if temperature == 0:
            for s in out:
                a, b = map(int, re.findall(r"(\d+)\+(\d+)=\?", self.tok.decode(s.prompt_ids))[-1])
                if (a + b) % 2:
                    s.text = s.text.replace(f"{{{a + b}}}", f"{{{a + b + 1}}}")
        return out


def _even_share(path):
    import pandas as pd
    df = pd.read_json(path, lines=True) if str(path).endswith(".jsonl") else pd.read_parquet(path)
    answers = df["answer"] if "answer" in df else df["reward_model"].map(lambda r: r["ground_truth"])
    return float((answers.astype(int) % 2 == 0).mean())


def test_several_files_are_reported_each_and_together(art, monkeypatch, tmp_path, capsys):
    """A verl file (its data_source) and a plain file (its name) in one run: each group's figures are
    its own rows', and the overall ones are those of all rows."""
    monkeypatch.setattr(evaluate, "make_rollout_engine", OddSumsWrongRollout)
    out = tmp_path / "m.json"
    files = f"{art / 'verl.jsonl'},{art / 'plain.parquet'}"
    assert main(["eval", str(art / "model"), files, "eval.n_samples=2", "eval.k=[1,2]", "reward.num_workers=0",
                 f"eval.output_json={out}"]) == 0
    m = json.loads(out.read_text())
    verl, plain = _even_share(art / "verl.jsonl"), _even_share(art / "plain.parquet")
    assert m["val/vcppo/add/num_prompts"] == 6 and m["val/plain/num_prompts"] == 6 and m["val/num_prompts"] == 12
    assert m["val/vcppo/add/pass@1_greedy"] == pytest.approx(verl)
    assert m["val/plain/pass@1_greedy"] == pytest.approx(plain)
    assert m["val/pass@1_greedy"] == pytest.approx((verl + plain) / 2)
    assert m["val/plain/pass@1"] == 0.5 and m["val/vcppo/add/pass@2"] == 1.0
    table = capsys.readouterr().out
    assert "| vcppo/add | 6 |" in table and "| plain | 6 |" in table and "| all | 12 |" in table
    # one file of one source: the figures of before, no per-source keys
    assert main(["eval", str(art / "model"), str(art / "plain.parquet"), "eval.n_samples=2", "eval.k=[1,2]",
                 "reward.num_workers=0", f"eval.output_json={out}"]) == 0
    assert not any(k.endswith("/num_prompts") and k != "val/num_prompts" for k in json.loads(out.read_text()))


def test_a_missing_model_is_said_in_one_line_not_read_as_yaml_or_a_hub_id(art, capsys):
    """Bare `vcppo eval` names what is missing (not a download hint for the default policy path);
    `vcppo eval DATA` says the model is missing (not that the parquet is bad YAML)."""
    bare = _fails(capsys)
    assert "MODEL_DIR and DATA are missing" in bare and "hf download" not in bare
    data_only = _fails(capsys, art / "plain.parquet")
    assert f"MODEL_DIR is missing: {art / 'plain.parquet'} is a data file" in data_only and "YAML" not in data_only
    assert "MODEL_DIR is missing" in _fails(capsys, art / "plain.jsonl")


def test_an_episode_checkpoint_is_evaluated_on_its_runs_episodes(tmp_path, capsys):
    """A checkpoint of a run with rollout.env: eval takes the env and its settings from the
    checkpoint's run config (else it would score single-turn answers of a multi-turn policy); a
    rollout.env on the command line wins."""
    from vcppo.config.load import to_dict
    from vcppo.config.schema import Config
    from vcppo.driver.durability.conversion import CHECKPOINT_TAG, is_checkpoint
    point = tmp_path / "checkpoints" / "step_000004"
    (point / "actor" / CHECKPOINT_TAG).mkdir(parents=True)
    (point / "state.json").write_text("{}")
    run = Config()
    run.rollout.env, run.rollout.env_args, run.rollout.max_turns = "guess", {"n": 16, "max_turns": 4}, 4
    (point / "run_config.json").write_text(json.dumps({"config": to_dict(run)}))
    assert is_checkpoint(point)
    cfg = evaluate.with_run_episodes(Config(), str(point), [str(point), "data.parquet"])
    assert (cfg.rollout.env, cfg.rollout.env_args, cfg.rollout.max_turns) == ("guess", {"n": 16, "max_turns": 4}, 4)
    assert "episodes of env 'guess'" in capsys.readouterr().out
    assert evaluate.with_run_episodes(Config(), str(point), [str(point), "d.parquet", "rollout.env=null"]).rollout.env \
        is None
