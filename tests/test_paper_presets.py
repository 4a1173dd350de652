"""The presets with the papers' settings: they load, hold the values docs/paper_settings.md gives
(read from the YAML files themselves, and from the loaded config), and `vcppo plan` says they fit
the hardware the doc names."""
import json
from pathlib import Path

import pytest
import yaml

from vcppo.commands.plan import main as plan_main
from vcppo.config.load import CONFIG_DIR, load_config

# preset -> (model shape, [GPUs it fits on one node of 8], expected values: dotted key -> value)
PAPER = {"algorithm.kl_coef": 0.0, "actor.lr": 1e-6, "critic.lr": 2e-6, "algorithm.lambda_critic": 1.0,
         "algorithm.gamma": 1.0, "model.dtype": "bfloat16", "model.policy_path": "", "data.train_files": ""}
VCPPO_32B = {**PAPER, "algorithm.lambda_actor": 0.95, "algorithm.eps_low": 0.2, "algorithm.eps_high": 0.2,
             "algorithm.loss_agg": "seq-mean-token-mean", "value_pretrain.steps": 100,
             "value_pretrain.lambda_critic": 1.0, "trainer.prompts_per_step": 8192,
             "rollout.n_samples_per_prompt": 1, "actor.ppo_mini_batches": 16, "reward.correct_score": 1.0,
             "reward.wrong_score": -1.0}
PRESETS = {
    "vcppo_paper_32b_8k": ("qwen2.5-32b", ["h200"], {**VCPPO_32B, "rollout.max_response_tokens": 8192}),
    "vcppo_paper_32b_16k": ("qwen2.5-32b", ["h200"], {**VCPPO_32B, "rollout.max_response_tokens": 16384}),
    "vapo_paper_32b": ("qwen2.5-32b", ["h200"], {
        **PAPER, "algorithm.length_adaptive_lambda": True, "algorithm.length_adaptive_alpha": 0.05,
        "algorithm.eps_low": 0.2, "algorithm.eps_high": 0.28, "algorithm.loss_agg": "token-mean",
        "algorithm.positive_lm_coef": 0.1, "value_pretrain.steps": 50, "trainer.prompts_per_step": 512,
        "rollout.n_samples_per_prompt": 16, "actor.ppo_mini_batches": 16, "trainer.dynamic_sampling": False}),
    "vcppo_7b_1node": ("qwen2.5-7b", ["h100", "h200"], {
        **PAPER, "algorithm.lambda_actor": 0.95, "value_pretrain.steps": 100,
        "rollout.max_response_tokens": 8192, "trainer.prompts_per_step": 1024, "actor.ppo_mini_batches": 2}),
}


def yaml_chain_value(name: str, key: str):
    """``key`` as the preset's own YAML files set it (the file, else the nearest ``extends:`` parent)."""
    section, field = key.split(".")
    path = CONFIG_DIR / f"{name}.yaml"
    while True:
        data = yaml.safe_load(path.read_text())
        if field in (data.get(section) or {}):
            return data[section][field]
        if "extends" not in data:
            raise KeyError(f"{name}: no YAML file of its chain sets {key}")
        path = CONFIG_DIR / data["extends"]


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_with_the_documented_values(name):
    cfg = load_config(name)
    assert cfg.preset == name
    for key, want in PRESETS[name][2].items():
        section, field = key.split(".")
        assert getattr(getattr(cfg, section), field) == want, f"{name}: {key}"
        assert yaml_chain_value(name, key) == want, f"{name}: {key} in the YAML"
    assert cfg.algorithm.kl_coef == 0.0  # KL off: no reference model is built


def test_every_yaml_line_names_its_source():
    for name in PRESETS:
        for line in (CONFIG_DIR / f"{name}.yaml").read_text().splitlines():
            if ":" in line and not line.lstrip().startswith("#") and line.startswith("  "):
                assert "#" in line, f"{name}: no source comment on {line.strip()!r}"


def test_doc_names_every_preset_and_its_plan_commands():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "paper_settings.md").read_text()
    for name, (shape, _, _) in PRESETS.items():
        assert f"vcppo plan {name} --model-shape {shape} --gpu h100" in doc
        assert f"vcppo plan {name} --model-shape {shape} --gpu h200" in doc


@pytest.mark.parametrize("name,gpu", [(n, g) for n, (_, gpus, _) in PRESETS.items() for g in gpus])
def test_plan_says_the_preset_fits_where_the_doc_says(name, gpu, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_main([name, "--model-shape", PRESETS[name][0], "--gpu", gpu, "--json", str(out)]) == 0
    assert "**Verdict: fits as configured.**" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["knobs"] == [] and result["plan"]["fits"]
