"""On a CPU, vLLM's KV cache holds what one call runs at once (``max_sequences`` sequences, at most
vLLM's 256, of the model's length, in whole blocks), not a share of host RAM, and what is sampled does
not change."""
import json

import pytest

from vcppo.engines.rollout import CPU_KV_BLOCK, CPU_MAX_SEQS, cpu_kv_cache_need


def _config_dir(tmp_path, **fields):
    base = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
            "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152}
    (tmp_path / "config.json").write_text(json.dumps({**base, **fields}))
    return str(tmp_path)


def test_the_need_counts_keys_and_values_of_every_layer_in_whole_blocks(tmp_path):
    path = _config_dir(tmp_path)  # SmolLM2-135M's shape: 30 layers x 3 KV heads x 64
    per_token_bf16 = 2 * 30 * 3 * 64 * 2
    need = cpu_kv_cache_need(path, "bfloat16", sequences=64, max_model_len=192)
    assert need == int(1.1 * 64 * 2 * CPU_KV_BLOCK * per_token_bf16)  # 192 tokens take 2 blocks
    assert cpu_kv_cache_need(path, "float32", 64, 192) == 2 * need
    assert cpu_kv_cache_need(path, "bfloat16", 64, CPU_KV_BLOCK) == need // 2
    assert cpu_kv_cache_need(path, "bfloat16", 5000, 192) == cpu_kv_cache_need(path, "bfloat16", CPU_MAX_SEQS, 192)


@pytest.mark.integration
def test_the_engine_holds_every_sequence_of_a_call_and_no_more_than_the_share(info, tiny_model_dir):
    from vcppo.config.schema import RolloutConfig
    from vcppo.engines.rollout import RolloutEngine
    sequences, length = 300, 600  # vLLM runs 256 at once; 256 x 640 tokens of the tiny model: above the 64 MiB floor
    engine = RolloutEngine(tiny_model_dir, RolloutConfig(gpu_memory_utilization=0.05), info, seed=0,
                           max_model_len=length, max_sequences=sequences)
    try:
        cache = engine.llm.llm_engine.vllm_config.cache_config
        concurrent = cache.num_gpu_blocks // -(-length // cache.block_size)
        assert cache.block_size == CPU_KV_BLOCK
        assert CPU_MAX_SEQS <= concurrent < 1.25 * CPU_MAX_SEQS, concurrent
    finally:
        engine.close()


@pytest.mark.extended
def test_a_cache_sized_to_the_call_samples_what_the_share_sized_one_does(info, tiny_model_dir, monkeypatch):
    """The same calls (512 and 100 sequences) on a cache sized for them and on one of 0.05 of host RAM:
    the same tokens and logprobs. A cache for 100 sequences changes the 512-sequence call (the
    sampler draws in the order the sequences run), which is why the size counts every sequence vLLM
    would run at once."""
    import vcppo.engines.rollout as rollout_module
    from vcppo.config.schema import RolloutConfig
    monkeypatch.setattr(rollout_module, "KV_FLOOR_BYTES", 1)
    prompts = [[(7 * i + j) % 100 + 5 for j in range(10 + i % 7)] for i in range(128)]
    drawn = {}
    for sequences in (None, 512, 100):
        engine = rollout_module.RolloutEngine(tiny_model_dir, RolloutConfig(gpu_memory_utilization=0.05), info,
                                              seed=0, max_model_len=300, max_sequences=sequences)
        try:
            calls = (engine.generate(prompts, n=4, temperature=1.0, top_p=1.0, max_tokens=200, seed=3),
                     engine.generate(prompts[:25], n=4, temperature=1.0, top_p=1.0, max_tokens=200, seed=4))
            drawn[sequences] = [[(s.response_ids, s.logprobs) for s in call] for call in calls]
        finally:
            engine.close()
    assert drawn[512] == drawn[None]
    assert drawn[100][1] == drawn[None][1]
    assert drawn[100][0] != drawn[None][0]  # too small for the 512-sequence call: what the size guards against
