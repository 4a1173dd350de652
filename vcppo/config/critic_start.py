"""What the critic starts from, checked before any engine starts: ``critic.init_from`` (a value model
written before) resolved to its directory and compared with the policy (shape and tokenizer), and
``critic.freeze`` matched against the critic's parameter names (read from its config on the meta
device: no weights loaded). Every error is one line naming the key."""
from __future__ import annotations

import hashlib
import json
import os

from vcppo.config.freeze_spec import unmatched
from vcppo.config.schema import Config
from vcppo.errors import ConfigError
from vcppo.methods import uses_critic

MARKER = "vcppo_value_model.json"  # vcppo.models.value_model.MARKER (not imported: it needs torch)
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model")


def resolve_init_from(path: str) -> str:
    """``critic.init_from`` -> the value-model directory it names: itself, or a run directory's
    ``final/critic``. ConfigError when it is neither."""
    for candidate in (path, os.path.join(path, "final", "critic")):
        if os.path.isfile(os.path.join(candidate, MARKER)):
            return candidate
    if not os.path.exists(path):
        raise ConfigError(f"config key 'critic.init_from': path does not exist: {path}")
    if os.path.isfile(os.path.join(path, "state.json")) and os.path.isdir(os.path.join(path, "critic")):
        raise ConfigError(f"config key 'critic.init_from': {path} is a run's training checkpoint (DeepSpeed states), "
                          f"not a value model: export its critic with `vcppo model export {path} --critic --out DIR` "
                          "and pass DIR")
    raise ConfigError(f"config key 'critic.init_from': {path} is neither a vcppo value-model directory ({MARKER}: "
                      "a run's final/critic, a critic-cache entry, `vcppo rm` output) nor a run directory with one "
                      "in final/critic")


def _config(directory: str) -> dict:
    with open(os.path.join(directory, "config.json")) as f:
        return json.load(f)


def _tokenizer_digest(directory: str) -> str | None:
    """A digest of the tokenizer's vocabulary files in ``directory`` (None: it has none)."""
    h, found = hashlib.sha256(), False
    for name in TOKENIZER_FILES:
        p = os.path.join(directory, name)
        if os.path.isfile(p):
            found = True
            with open(p, "rb") as f:
                data = f.read()
            if name == "tokenizer.json":  # the vocabulary and merges, not the padding / truncation settings
                model = json.loads(data).get("model", {})
                data = json.dumps([model.get("vocab"), model.get("merges")], sort_keys=True).encode()
            h.update(name.encode() + data)
    return h.hexdigest() if found else None


def check_init_from(cfg: Config) -> str:
    """The resolved source of ``critic.init_from``; ConfigError when its model shape or tokenizer is
    not the policy's (values read at other positions, or of another vocabulary, mean nothing)."""
    source = resolve_init_from(cfg.critic.init_from)
    policy = cfg.model.policy_path
    if not os.path.isfile(os.path.join(policy, "config.json")):
        return source  # a hub id: its files are checked where they are fetched
    ours, theirs = _config(policy), _config(source)
    for key in SHAPE_KEYS:
        if ours.get(key) != theirs.get(key):
            raise ConfigError(f"config key 'critic.init_from': {source} has {key} {theirs.get(key)}, the policy "
                              f"({policy}) {ours.get(key)}: the critic must share the policy's shape")
    tok_dir = cfg.model.tokenizer_path or policy
    mine, its = _tokenizer_digest(tok_dir), _tokenizer_digest(source)
    if mine and its and mine != its:
        raise ConfigError(f"config key 'critic.init_from': {source}'s tokenizer is not the run's ({tok_dir}): "
                          "its values were learned over other token ids")
    return source


def critic_parameter_names(model_dir: str) -> list[str]:
    """The value model's parameter names (``backbone.*``) for a backbone directory, built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        backbone = AutoModel.from_config(config)
    return [f"backbone.{n}" for n, _ in backbone.named_parameters()] + ["value_head.weight", "value_head.bias"]


def check_critic_start(cfg: Config) -> None:
    """``critic.init_from`` and ``critic.freeze`` against the models they name (a run with a critic)."""
    if not uses_critic(cfg.algorithm.advantage_estimator):
        return
    source = check_init_from(cfg) if cfg.critic.init_from else None
    if not cfg.critic.freeze:
        return
    init = cfg.model.critic_init
    model_dir = source or (cfg.model.policy_path if init == "policy" else cfg.model.critic_path)
    if not model_dir or not os.path.isfile(os.path.join(model_dir, "config.json")):
        return
    problem = unmatched(list(cfg.critic.freeze), critic_parameter_names(model_dir))
    if problem:
        raise ConfigError(f"config key 'critic.freeze': {problem} ({model_dir})")
