"""Thin wrappers around the real engines: vLLM rollout, DeepSpeed actor / critic / reference.

Heavy imports (vllm, deepspeed) happen inside the submodules; import what you need, e.g.
``from vcppo.engines.actor import ActorEngine``. See docs/engines.md.
"""
from vcppo.runtime.dist import DistInfo, init_distributed, shutdown  # noqa: F401
