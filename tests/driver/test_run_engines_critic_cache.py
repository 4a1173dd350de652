"""The critic cache's key comes from the schema's tags: every key that changes what value pretraining's
critic learns changes it, every other key leaves it, and the same keys refuse a resume that changes them."""
import copy
import dataclasses
import functools

import pytest

from vcppo.config.load import all_keys, load_config, to_dict
from vcppo.config.provenance import CLASSES, CRITIC_CACHE_KEYS, PATH_KEYS, diff_configs, refuse_changes
from vcppo.config.schema import Config
from vcppo.errors import ConfigError
from vcppo.driver.run_engines import cache_key

EPISODE_KEYS = ("rollout.env", "rollout.env_args", "rollout.max_turns", "rollout.turn_max_tokens")
# what a key must be set to for the run to read it (a policy-initialised critic ignores model.critic_path)
READ_WHEN = {"model.critic_path": {"model.critic_init": "reward_model"}}


def _field(key: str) -> dataclasses.Field:
    cls, parts = Config, key.split(".")
    for part in parts[:-1]:
        cls = {f.name: f for f in dataclasses.fields(cls)}[part].default_factory
    return {f.name: f for f in dataclasses.fields(cls)}[parts[-1]]


def _set(cfg: Config, key: str, value) -> Config:
    out = copy.deepcopy(cfg)
    *path, name = key.split(".")
    setattr(functools.reduce(getattr, path, out), name, value)
    return out


def _get(cfg: Config, key: str):
    return functools.reduce(getattr, key.split("."), cfg)


def _other_value(key: str, value, other_dir: str):
    """A value of ``key`` other than ``value`` (the schema is not validated: only the key is hashed)."""
    f = _field(key)
    if key in PATH_KEYS:
        return other_dir
    choices = f.metadata.get("choices")
    if choices:
        return [c for c in choices if c != value][-1]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if isinstance(value, int) else (value / 2 if value else 0.5)
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value + ["x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    kind = str(f.type)  # None: set it by its annotation
    for name, new in (("bool", True), ("int", 7), ("float", 1.5), ("List", ["x"]), ("Dict", {"x": 1}),
                      ("str", "mod:Name")):
        if name in kind:
            return new
    raise AssertionError(f"no other value for {key} ({kind})")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cache")
    for name, data in (("m", b"x"), ("other", b"yy")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "w.bin").write_bytes(data)
    (tmp_path / "d.parquet").write_bytes(b"y")
    cfg = load_config("vcppo", [f"model.policy_path={tmp_path / 'm'}", f"data.train_files={tmp_path / 'd.parquet'}"])
    return cfg, str(tmp_path / "other")


def test_the_episode_keys_change_the_key(base):
    cfg, _ = base
    for key, value in (("rollout.env", "guess"), ("rollout.env_args", {"low": 1}), ("rollout.max_turns", 3),
                       ("rollout.turn_max_tokens", 16)):
        assert cache_key(_set(cfg, key, value)) != cache_key(cfg), key


@pytest.mark.parametrize("key", CRITIC_CACHE_KEYS)
def test_every_tagged_key_changes_the_key(base, key):
    cfg, other = base
    for context, value in READ_WHEN.get(key, {}).items():
        cfg = _set(cfg, context, value)
    changed = _set(cfg, key, _other_value(key, _get(cfg, key), other))
    assert cache_key(changed) != cache_key(cfg)


@pytest.mark.parametrize("key", sorted(set(all_keys()) - set(CRITIC_CACHE_KEYS)))
def test_every_other_key_keeps_the_key(base, key):
    cfg, other = base
    changed = _set(cfg, key, _other_value(key, _get(cfg, key), other))
    assert cache_key(changed) == cache_key(cfg)


def test_the_tags_say_what_pretraining_reads():
    assert set(EPISODE_KEYS) <= set(CRITIC_CACHE_KEYS)
    # the RL phase's algorithm, the actor and the seed: a sweep over them shares one critic
    for key in ("trainer.seed", "algorithm.advantage_estimator", "algorithm.lambda_actor", "algorithm.lambda_critic",
                "actor.lr", "actor.lora.rank", "trainer.dynamic_sampling"):
        assert key not in CRITIC_CACHE_KEYS and CLASSES[key] in ("math", "fixed"), key
    # the value loss is aggregated by algorithm.loss_agg in pretraining too
    assert {"algorithm.gamma", "algorithm.loss_agg", "value_pretrain.lambda_critic"} <= set(CRITIC_CACHE_KEYS)


@pytest.mark.parametrize("key", EPISODE_KEYS + ("critic.lr", "value_pretrain.steps"))
def test_a_resume_refuses_a_change_of_a_key_the_critic_depends_on(base, key, tmp_path):
    cfg, other = base
    changed = _set(cfg, key, _other_value(key, _get(cfg, key), other))
    changes = diff_configs(to_dict(cfg), to_dict(changed))
    assert [c.key for c in changes] == [key]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        refuse_changes(changes, [], tmp_path)


def test_every_key_the_critic_depends_on_is_refused_on_resume():
    # one set of tags: a key in the critic's cache key is one a resume refuses to change silently
    assert all(CLASSES[key] in ("math", "fixed") for key in CRITIC_CACHE_KEYS)
