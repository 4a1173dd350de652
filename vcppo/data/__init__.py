"""Synthetic long-CoT tasks (`tasks`) and prompt loading / streaming (`dataset`)."""
from vcppo.data.dataset import PromptSet, PromptStream, encode_prompt, format_prompt, load_prompts
from vcppo.data.tasks import (check_add_trace, answer_from_trace, count_tokens, generate, split_of,
                              trace_length_stats)

__all__ = ["PromptSet", "PromptStream", "answer_from_trace", "check_add_trace", "count_tokens",
           "encode_prompt", "format_prompt", "generate", "load_prompts", "split_of",
           "trace_length_stats"]
