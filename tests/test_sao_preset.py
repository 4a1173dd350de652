"""The `sao` preset: SAO's settings as the public ports quote them, each YAML line with its source."""
import pytest

from vcppo.config.load import CONFIG_DIR, load_config


def test_every_sao_yaml_line_names_its_source():
    for line in (CONFIG_DIR / "sao.yaml").read_text().splitlines():
        if ":" in line and not line.lstrip().startswith("#") and line.startswith("  "):
            assert "#" in line, f"no source comment on {line.strip()!r}"


def test_sao_holds_the_recipe():
    cfg = load_config("sao")
    assert (cfg.rollout.n_samples_per_prompt, cfg.algorithm.policy_loss) == (1, "dis")
    assert (1 - cfg.algorithm.eps_low, 1 + cfg.algorithm.eps_high) == pytest.approx((0.2, 4.0))
    assert cfg.critic.lr == 5 * cfg.actor.lr and cfg.critic.ppo_epochs == 2 and cfg.critic.freeze == ["attention"]
    assert (cfg.value_pretrain.steps, cfg.value_pretrain.early_stop, cfg.algorithm.lambda_critic) == (10, False, 1.0)
