"""Local tokenizer + named-size Qwen2 model factory (no hub downloads)."""
from vcppo.models.factory import SIZES, count_params, make_model, model_config
from vcppo.models.tokenizer import build_tokenizer, load_tokenizer

__all__ = ["SIZES", "build_tokenizer", "count_params", "load_tokenizer", "make_model", "model_config"]
