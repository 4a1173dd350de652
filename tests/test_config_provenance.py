"""Every config key says what a change of it does on resume (schema ``resume=``), and the rules
that follow: math refused unless allowed, numerics and free accepted, fixed never."""
import dataclasses
from pathlib import Path

import pytest

from vcppo.config import schema
from vcppo.config.load import all_keys, load_config, to_dict
from vcppo.config.provenance import (CLASSES, HISTORY_FILE, check_allow_list, diff_configs, read_history,
                                     record_segment, refuse_changes, summary)
from vcppo.config.schema import RESUME_CLASSES
from vcppo.errors import ConfigError


def test_every_key_is_classified():
    assert set(CLASSES) == set(all_keys())
    unclassified = [k for k, c in CLASSES.items() if c not in RESUME_CLASSES]
    assert not unclassified, unclassified


def test_a_new_field_must_name_its_class():
    with pytest.raises(TypeError, match="resume"):
        schema._f(1, "a new knob")
    with pytest.raises(ValueError, match="not one of"):
        schema._f(1, "a new knob", resume="maybe")


@pytest.mark.parametrize("key,klass", [
    ("algorithm.lambda_actor", "math"), ("algorithm.gamma", "math"), ("trainer.prompts_per_step", "math"),
    ("rollout.n_samples_per_prompt", "math"), ("data.train_files", "math"), ("actor.lr", "math"),
    ("actor.lora.alpha", "math"), ("trainer.seed", "math"),
    ("actor.lora.rank", "fixed"), ("actor.lora.target_modules", "fixed"), ("critic.lora.rank", "fixed"),
    ("critic.confidence_features", "fixed"),
    # micro-batching, packing, recomputation, chunked logprobs: the same math, other rounding
    ("actor.micro_batch_size", "numerics"), ("actor.max_tokens_per_micro_batch", "numerics"),
    ("actor.packed", "numerics"), ("critic.gradient_checkpointing", "numerics"),
    ("actor.logprob_chunk_size", "numerics"), ("reference.logprob_chunk_size", "numerics"),
    ("actor.zero_stage", "numerics"), ("placement.mode", "numerics"),
    ("trainer.total_steps", "free"), ("trainer.save_every", "free"), ("logging.wandb", "free"),
    ("trainer.resume_allow_changes", "free"), ("trainer.abort_on_divergence", "free"),
    ("sft.lr", "free"), ("rm.micro_batch_size", "free"), ("eval.k", "free"),  # not read by vcppo train
])
def test_classes_of_some_keys(key, klass):
    assert CLASSES[key] == klass


def _changes(**overrides):
    old = to_dict(load_config("vcppo"))
    new = to_dict(load_config("vcppo", [f"{k}={v}" for k, v in overrides.items()]))
    return diff_configs(old, new)


def test_a_math_change_is_refused_naming_the_key_and_both_values(tmp_path):
    changes = _changes(**{"algorithm.lambda_actor": 0.5, "trainer.total_steps": 500})
    assert {c.key: c.klass for c in changes} == {"algorithm.lambda_actor": "math", "trainer.total_steps": "free"}
    with pytest.raises(ConfigError) as e:
        refuse_changes(changes, [], tmp_path)
    msg = str(e.value)
    assert "algorithm.lambda_actor 0.95 -> 0.5" in msg and "trainer.total_steps" not in msg
    assert "trainer.resume_allow_changes=[algorithm.lambda_actor]" in msg and "\n" not in msg
    refuse_changes(changes, ["algorithm.lambda_actor"], tmp_path)  # allowed: no error
    assert "allowed by trainer.resume_allow_changes" in summary(changes)


def test_numerics_and_free_changes_go_through():
    changes = _changes(**{"actor.micro_batch_size": 2, "logging.wandb": False, "trainer.save_every": 5})
    refuse_changes(changes, [], Path("ckpt"))
    assert "no longer bit-exact" in summary(changes)


def test_a_fixed_change_is_refused_even_when_allowed(tmp_path):
    changes = _changes(**{"actor.lora.rank": 8})
    with pytest.raises(ConfigError, match=r"config key 'actor.lora.rank': 0 in checkpoint .* 8 now.*actor.lora.rank=0"):
        refuse_changes(changes, ["actor.lora.rank"], tmp_path)
    with pytest.raises(ConfigError, match="cannot be allowed"):
        check_allow_list(["actor.lora.rank"])


def test_the_allow_list_names_real_keys():
    assert load_config("vcppo", ["trainer.resume_allow_changes=[algorithm.lambda_actor]"])
    with pytest.raises(ConfigError, match="did you mean 'algorithm.lambda_actor'"):
        load_config("vcppo", ["trainer.resume_allow_changes=[algorithm.lamda_actor]"])


def test_a_key_an_older_config_lacks_is_not_a_change():
    old = to_dict(load_config("vcppo"))
    del old["actor"]["logprob_chunk_size"]
    assert diff_configs(old, to_dict(load_config("vcppo"))) == []


def test_integers_and_floats_compare_by_value():
    old = to_dict(load_config("vcppo"))
    old["algorithm"]["gamma"] = 1  # YAML may hold 1 for 1.0
    assert diff_configs(old, to_dict(load_config("vcppo"))) == []


def test_the_history_records_each_segment(tmp_path):
    record_segment(tmp_path, phase="start", step=0, global_step=0, resumed_from=None, changes=[],
                   argv=["vcppo", "train", "vcppo"])
    changes = _changes(**{"algorithm.lambda_actor": 0.5})
    record_segment(tmp_path, phase="ppo", step=3, global_step=5, resumed_from=tmp_path / "step_000005",
                   changes=changes, argv=["vcppo", "train", "vcppo", "algorithm.lambda_actor=0.5"])
    first, second = read_history(tmp_path)
    assert (first["segment"], first["resumed_from"], first["changes"]) == (1, None, {})
    assert second["segment"] == 2 and second["step"] == 3 and second["command"].endswith("algorithm.lambda_actor=0.5")
    assert second["changes"] == {"algorithm.lambda_actor": {"old": 0.95, "new": 0.5, "class": "math"}}
    assert (tmp_path / HISTORY_FILE).is_file()


def test_sections_vcppo_train_does_not_read_are_free_whatever_their_fields_inherit():
    sft_fields = {f.name for f in dataclasses.fields(schema.SFTConfig)}
    assert all(CLASSES[f"sft.{name}"] == "free" for name in sft_fields)
