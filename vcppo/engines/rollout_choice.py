"""Which rollout engine samples (``rollout.engine``): vLLM (:mod:`vcppo.engines.rollout`) or
transformers' ``generate`` (:mod:`vcppo.engines.rollout_hf`); both have one interface, so callers
build one here and never branch on it."""
from __future__ import annotations

import sys

from vcppo.runtime.dist import DistInfo
from vcppo.engines.rollout import RolloutEngine
from vcppo.engines.rollout_hf import HFRolloutEngine
from vcppo.config.schema import Config, RolloutConfig
from vcppo.errors import ConfigError

ENGINES = {"vllm": RolloutEngine, "hf": HFRolloutEngine}


def vllm_import_error() -> str | None:
    """Why ``import vllm`` fails here (its last line), or None when it imports."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure (missing, wrong CUDA, wrong torch) means hf
        return f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}".rstrip(": ")
    return None


def choose_engine(setting: str) -> tuple[str, str]:
    """(engine name, why) for ``rollout.engine`` = ``setting``. ``vllm`` where it does not import is
    a config error naming the key."""
    if setting == "hf":
        return "hf", "rollout.engine=hf"
    error = vllm_import_error()
    if setting == "vllm":
        if error is not None:
            raise ConfigError(f"rollout.engine=vllm, but vllm does not import here ({error}); "
                              "set rollout.engine=hf (or auto)")
        return "vllm", "rollout.engine=vllm"
    if error is not None:
        return "hf", f"rollout.engine=auto and vllm does not import here ({error})"
    return "vllm", "rollout.engine=auto and vllm imports"


def make_rollout_engine(model_path: str, cfg: RolloutConfig, dist: DistInfo, seed: int, max_model_len: int,
                        dtype: str = "auto", lora_rank: int = 0, log=None, max_sequences: int | None = None):
    """The configured engine; one log line says which and why. ``max_sequences``: the most sequences one
    call sends (vLLM on a CPU sizes its KV cache from it)."""
    name, why = choose_engine(cfg.engine)
    (log or (lambda m: print(m, file=sys.stderr)))(f"rollout engine: {name} ({why})")
    extra = {"max_sequences": max_sequences} if name == "vllm" else {}
    return ENGINES[name](model_path, cfg, dist, seed=seed, max_model_len=max_model_len, dtype=dtype,
                         lora_rank=lora_rank, **extra)


def sequences_per_call(cfg: Config) -> int:
    """The most sequences a run's one ``generate`` call sends: a step's (all ranks'), or a validation's."""
    return max(cfg.trainer.prompts_per_step * cfg.rollout.n_samples_per_prompt,
               cfg.trainer.val_max_prompts * cfg.trainer.val_n_samples)
