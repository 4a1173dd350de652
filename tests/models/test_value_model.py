"""The value head computes in fp32 even when the backbone runs in bf16 (fast, no engines)."""
import torch

from vcppo.models.value_model import FP32Linear, ValueModel


def _bf16_value_model():
    from transformers import Qwen2Config, Qwen2Model
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    vm = ValueModel(Qwen2Model(cfg).to(torch.bfloat16))
    with torch.no_grad():
        vm.value_head.weight.normal_()
        vm.value_head.bias.fill_(0.1234567)
    return vm


def test_bf16_backbone_gets_fp32_values():
    vm = _bf16_value_model().eval()
    assert isinstance(vm.value_head, FP32Linear) and vm.value_head.weight.dtype == torch.bfloat16
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        values = vm(ids)
        h = vm.backbone(input_ids=ids).last_hidden_state
    assert values.dtype == torch.float32 and values.shape == (2, 7)
    expect = h.float() @ vm.value_head.weight.float()[0] + vm.value_head.bias.float()
    torch.testing.assert_close(values, expect, rtol=1e-6, atol=1e-6)
    # what a bf16 head would have given: rounded to bf16's 8-bit mantissa
    bf16_head = torch.nn.functional.linear(h, vm.value_head.weight, vm.value_head.bias).squeeze(-1).float()
    assert (values - bf16_head).abs().max() > 1e-4
