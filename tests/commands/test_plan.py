"""`vcppo plan`: the planner's figures against DeepSpeed's own estimator and real models, the knob it
names against a re-run with that knob, and the command on a shipped preset. No engine starts.
(The activation figures against a measured train step: scripts/plan_vs_measured.py.)"""
import json
import re
from pathlib import Path

import pytest

from vcppo.cli import main as cli_main
from vcppo.commands.plan import main as plan_main
from vcppo.config.load import load_config
from vcppo.plan.advise import Cluster, Shapes, plan_run
from vcppo.plan.knobs import Setting, find_fit
from vcppo.plan.memory import model_states
from vcppo.models.shapes import BUILTIN_SHAPES, read_shape
from vcppo.plan.hardware import HARDWARE, GiB

REPO = Path(__file__).resolve().parents[2]
LONG_COT = ["rollout.max_response_tokens=8192"]


def deepspeed_zero3_rows(total: int, largest: int, gpus: int, nodes: int, capsys) -> dict:
    """DeepSpeed's printed estimate, zero_init=1 rows (vcppo builds ZeRO-3 models under zero.Init):
    {(offload_optimizer, offload_params): (cpu GiB per node, gpu GiB)}."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
    capsys.readouterr()
    estimate_zero3_model_states_mem_needs_all_cold(total, largest, num_gpus_per_node=gpus, num_nodes=nodes,
                                                   additional_buffer_factor=1.0)
    rows = {}
    for cpu, gpu, opts in re.findall(r"([\d.]+)GB \|\s+([\d.]+)GB \| (.*zero_init=1)", capsys.readouterr().out):
        key = ("offload_optimizer=none" not in opts, "offload_param=none" not in opts)
        rows[key] = (float(cpu), float(gpu))
    assert len(rows) == 3, rows
    return rows


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-72b"])
@pytest.mark.parametrize("gpus,nodes", [(8, 1), (8, 4)])
def test_zero3_states_agree_with_deepspeeds_estimator(name, gpus, nodes, capsys):
    """GPU: DeepSpeed keeps the bf16 partition and the largest module's weights + gradients there,
    as we do, and without offload 18 bytes per parameter (2 + 4 + 12), as we do. CPU per node with
    offload (at DeepSpeed's additional_buffer_factor=1; it defaults to a 1.5x margin).
    `pytest -rP` shows the figures."""
    shape = BUILTIN_SHAPES[name]
    n, largest = shape.params, shape.largest_module_params
    ds = deepspeed_zero3_rows(n, largest, gpus, nodes, capsys)
    for (opt, par), (ds_cpu, ds_gpu) in ds.items():
        s = model_states(n, largest, gpus * nodes, 3, 2, True, offload_optimizer=opt, offload_params=par)
        ours_gpu = (s.resident_bytes + s.gather_bytes) / GiB
        ours_cpu = s.cpu_bytes * gpus / GiB
        error = ours_gpu / ds_gpu - 1
        print(f"{name} {nodes}x{gpus} offload_optimizer={opt} offload_params={par}: GPU ours {ours_gpu:.2f} "
              f"DeepSpeed {ds_gpu:.2f} GiB ({error:+.1%}); CPU/node ours {ours_cpu:.2f} DeepSpeed {ds_cpu:.2f}")
        if opt:  # (without offload DeepSpeed's CPU figure is the load of the largest module, not a state)
            assert ours_cpu == pytest.approx(ds_cpu, abs=0.011)
        # within DeepSpeed's own rounding of its printout (0.01 GiB)
        assert ours_gpu == pytest.approx(ds_gpu, abs=0.011), f"{error:+.2%}"


@pytest.mark.parametrize("name", ["qwen2.5-7b", "qwen2.5-32b"])
def test_zero2_states_agree_with_deepspeeds_estimator(name, capsys):
    """ZeRO-2 keeps the whole 16-bit weights on every GPU and partitions 16-bit and fp32 gradients
    and the optimizer states (2 + 18 / ranks bytes per parameter); with optimizer offload only the
    weights stay (DeepSpeed's estimate_zero2_model_states_mem_needs_all_cold)."""
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold
    shape = BUILTIN_SHAPES[name]
    capsys.readouterr()
    estimate_zero2_model_states_mem_needs_all_cold(shape.params, num_gpus_per_node=8, num_nodes=1,
                                                   additional_buffer_factor=1.0)
    rows = {"none" not in opts: float(gpu) for gpu, opts in
            re.findall(r"[\d.]+GB \|\s+([\d.]+)GB \| (offload_optimizer=\S+)", capsys.readouterr().out)}
    assert len(rows) == 2, rows
    for offload, ds_gpu in rows.items():
        s = model_states(shape.params, shape.largest_module_params, 8, 2, 2, True, offload_optimizer=offload)
        assert s.resident_bytes / GiB == pytest.approx(ds_gpu, abs=0.011), offload


@pytest.mark.parametrize("size", ["tiny", "small", "medium"])
@pytest.mark.parametrize("tied", [True, False])
def test_params_from_config_json_equal_a_real_model(size, tied, tmp_path):
    import torch
    from deepspeed.runtime.zero.stage3 import model_to_params
    from transformers import Qwen2ForCausalLM

    from vcppo.models.factory import model_config
    from vcppo.models.tokenizer import build_tokenizer
    from vcppo.models.value_model import ValueModel

    config = model_config(size, build_tokenizer(), tied=tied)
    config.to_json_file(str(tmp_path / "config.json"))
    shape = read_shape(tmp_path, "model.policy_path")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.largest_module_params == model_to_params(model)[1]  # what DeepSpeed's estimator reads
    critic = ValueModel(model.model)
    assert shape.value_model_params == sum(p.numel() for p in critic.parameters())


@pytest.mark.parametrize("name", list(BUILTIN_SHAPES))
def test_builtin_shapes_count_like_transformers(name):
    """The built-in Qwen2.5 shapes, built on the meta device (no memory): the same count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    s = BUILTIN_SHAPES[name]
    config = Qwen2Config(vocab_size=s.vocab_size, hidden_size=s.hidden_size, num_hidden_layers=s.num_layers,
                         num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads,
                         intermediate_size=s.intermediate_size, tie_word_embeddings=s.tie_word_embeddings)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert s.params == sum(p.numel() for p in model.parameters())


def _plan(preset, overrides, shape, gpu, nodes=1):
    cfg = load_config(preset, overrides)
    shapes = Shapes(BUILTIN_SHAPES[shape], BUILTIN_SHAPES[shape], BUILTIN_SHAPES[shape])
    return cfg, shapes, Cluster(HARDWARE[gpu], 8, nodes)


@pytest.mark.parametrize("shape,gpu,overrides", [
    ("qwen2.5-7b", "h100", LONG_COT),
    ("qwen2.5-32b", "h100", LONG_COT),
    ("qwen2.5-32b", "h200", LONG_COT + ["algorithm.kl_coef=0.01"]),
    ("qwen2.5-72b", "a100", LONG_COT),
    ("qwen2.5-7b", "h100", LONG_COT + ["placement.mode=split", "placement.rollout_ranks=2"]),
])
def test_the_named_knob_makes_the_run_fit(shape, gpu, overrides):
    """The configured run does not fit; re-planned from the config loaded with the knobs the
    planner names (as a user would type them), it fits."""
    cfg, shapes, cluster = _plan("vcppo", overrides, shape, gpu)
    assert not plan_run(cfg, shapes, cluster).fits
    knobs, fitted = find_fit(Setting(cfg, cluster), shapes, 0.35)
    assert knobs and fitted.fits, knobs
    nodes = [int(k.split("=")[1]) for k in knobs if k.startswith("--nodes=")]
    cfg2, _, cluster2 = _plan("vcppo", overrides + [k for k in knobs if not k.startswith("--")], shape, gpu,
                              nodes=nodes[-1] if nodes else 1)
    again = plan_run(cfg2, shapes, cluster2)
    assert again.fits and again.checks == fitted.checks


def test_ranks_on_a_cpu_share_its_memory_and_offload_is_never_a_knob_there():
    """Two CPU ranks on one 24 GiB machine get 10 GiB each (20 usable), not 20 each; moving optimizer
    states to the host frees nothing when the host is the device."""
    overrides = ["trainer.prompts_per_step=2", "rollout.n_samples_per_prompt=2", "rollout.max_response_tokens=128",
                 "data.max_prompt_tokens=64", "actor.micro_batch_size=2", "critic.micro_batch_size=2",
                 "rollout.gpu_memory_utilization=0.05"]
    cfg = load_config("vcppo", overrides)
    shapes = Shapes(*[BUILTIN_SHAPES["qwen2.5-0.5b"]] * 3)
    one, two = (plan_run(cfg, shapes, Cluster(HARDWARE["cpu24"], n, 1)) for n in (1, 2))
    assert two.checks[0].usable_bytes == pytest.approx(one.checks[0].usable_bytes / 2)
    knobs, _ = find_fit(Setting(cfg, Cluster(HARDWARE["cpu24"], 2, 1)), shapes, 0.35)
    assert knobs and not any("offload" in k for k in knobs)


def test_a_run_that_fits_needs_no_knob():
    cfg, shapes, cluster = _plan("vcppo", [], "qwen2.5-0.5b", "h200")
    knobs, plan = find_fit(Setting(cfg, cluster), shapes, 0.35)
    assert knobs == [] and plan.fits


def test_checkpointing_and_offload_only_ever_lower_the_training_need():
    cfg, shapes, cluster = _plan("vcppo", LONG_COT, "qwen2.5-7b", "h100")
    need = lambda overrides: plan_run(load_config("vcppo", LONG_COT + overrides), shapes, cluster).checks[0].need_bytes  # noqa: E731
    base = need([])
    assert need(["actor.gradient_checkpointing=true"]) < base
    assert need(["actor.micro_batch_size=1"]) < base
    assert need(["actor.offload_optimizer=true"]) < base


def test_the_command_prints_a_table_and_the_same_numbers_as_json(tmp_path, capsys):
    out_json = tmp_path / "plan.json"
    code = cli_main(["plan", "vcppo", "--model-shape", "qwen2.5-7b", "--gpu", "h100", *LONG_COT,
                     "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0
    assert "| actor | 8 | 3 |" in out and "| critic |" in out and "| rollout |" in out and "Verdict" in out
    data = json.loads(out_json.read_text())
    for check in data["plan"]["checks"]:
        assert f"| {check['phase']} | {check['need_gib']:,.1f} | {check['usable_gib']:,.1f} |" in out
    assert data["knobs"] and " ".join(data["knobs"]) in out


def test_a_missing_model_shape_names_the_key(capsys):
    code = cli_main(["plan", "vcppo", "model.policy_path=/nope/model"])
    err = capsys.readouterr().err
    assert code == 2 and "model.policy_path" in err and "--model-shape" in err and "Traceback" not in err
    assert cli_main(["plan", "vcppo", "actor.micro_batch_sise=2", "--model-shape", "qwen2.5-7b"]) == 2
    assert "actor.micro_batch_size" in capsys.readouterr().err


def test_the_documented_plans_run(capsys):
    """Every `vcppo plan` line of the docs runs (docs/scaling.md's tables come from them); a
    `--measure` line, which needs its model directory and minutes of engine time, is parsed
    (tests/plan/test_plan_measure.py runs that command against a real run)."""
    from tests.test_doc_commands import command_lines
    from vcppo.commands.plan import parser
    lines = [line for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
             for line in command_lines(doc) if line.startswith("vcppo plan ")]
    assert len(lines) >= 4, lines
    for line in lines:
        if "--measure" in line.split():
            args = parser().parse_intermixed_args(line.split()[2:])
            assert args.measure and load_config(args.args[0], args.args[1:])
            continue
        assert plan_main(line.split()[2:]) == 0, line
    assert "Verdict" in capsys.readouterr().out


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"]])
def test_lora_params_count_like_peft(targets):
    """The adapters' parameter count, against peft's own adapters on a meta-device Qwen2.5-0.5B."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from vcppo.engines.lora import add_adapters
    from vcppo.config.schema import LoRAConfig
    s = BUILTIN_SHAPES["qwen2.5-0.5b"]
    config = Qwen2Config(vocab_size=s.vocab_size, hidden_size=s.hidden_size, num_hidden_layers=s.num_layers,
                         num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads,
                         intermediate_size=s.intermediate_size, tie_word_embeddings=s.tie_word_embeddings)
    with torch.device("meta"):
        model = add_adapters(Qwen2ForCausalLM(config), LoRAConfig(rank=16, target_modules=targets))
    assert s.lora_params(16, targets) == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_lora_keeps_weights_and_drops_optimizer_states_and_the_reference():
    """LoRA: the weights stay, gradients and AdamW states shrink to the adapters' (and the critic's
    head), the reference engine is the actor (no engine of its own), backward costs 4 N, not 6 N."""
    overrides = LONG_COT + ["algorithm.kl_coef=0.01"]
    lora = ["actor.lora.rank=64", "critic.lora.rank=64"]
    cfg, shapes, cluster = _plan("vcppo", overrides, "qwen2.5-32b", "h100")
    full = plan_run(cfg, shapes, cluster)
    adapted = plan_run(load_config("vcppo", overrides + lora), shapes, cluster)
    by_role = lambda plan: {e.role: e for e in plan.engines}  # noqa: E731
    assert set(by_role(full)) == {"actor", "critic", "reference"} and set(by_role(adapted)) == {"actor", "critic"}
    s = BUILTIN_SHAPES["qwen2.5-32b"]
    for role, head in (("actor", 0), ("critic", s.hidden_size + 1)):
        f, a = by_role(full)[role].states, by_role(adapted)[role].states
        assert a.params_bytes == f.params_bytes
        trained = s.lora_params(64, ["all-linear"]) + head
        assert a.optimizer_bytes == pytest.approx(12 * trained / 8)  # bf16: fp32 master + 2 moments, 8 ranks
        assert a.optimizer_bytes < f.optimizer_bytes / 50  # rank 64 on every linear layer: 1.6% of 32B
    assert adapted.time.training_s < full.time.training_s


def test_critic_ranks_hold_the_critic_apart_and_its_update_overlaps_the_actors():
    """3 actor + 3 critic + 2 rollout GPUs: each side's ranks hold only their engines, and training
    takes the slower side's time: below both updates on 3 GPUs, never below both on 6 (the same
    FLOPs on the same GPUs: side by side is no faster by this arithmetic)."""
    split = LONG_COT + ["placement.mode=split", "trainer.max_staleness=1", "algorithm.rollout_is_cap=2"]
    cfg, shapes, cluster = _plan("vcppo", split + ["placement.rollout_ranks=2", "placement.critic_ranks=3"],
                                 "qwen2.5-7b", "h200")
    plan = plan_run(cfg, shapes, cluster)
    assert [c.phase for c in plan.checks] == ["actor ranks: states + working set", "critic ranks: states + working set",
                                              "rollout ranks: vLLM"]
    on_three = plan_run(load_config("vcppo", split + ["placement.rollout_ranks=5"]), shapes, cluster)
    on_six = plan_run(load_config("vcppo", split + ["placement.rollout_ranks=2"]), shapes, cluster)
    assert plan.time.training_gpus == on_three.time.training_gpus == 3
    assert on_six.time.training_s <= plan.time.training_s < on_three.time.training_s
    with pytest.raises(Exception, match="placement.critic_ranks"):
        plan_run(load_config("vcppo", split + ["placement.critic_ranks=2"]), shapes, cluster)


def test_mean_lengths_set_the_training_tokens_and_measure_needs_a_model(tmp_path, capsys):
    """--prompt-tokens / --response-tokens: the step's training tokens are responses x their sum;
    --measure builds the real engines, so without a model directory it names the key."""
    out = tmp_path / "plan.json"
    assert cli_main(["plan", "vcppo", "--model-shape", "qwen2.5-0.5b", "--prompt-tokens", "100",
                     "--response-tokens", "50", "--json", str(out)]) == 0
    time = json.loads(out.read_text())["plan"]["time"]
    assert time["train_tokens"] == 64 * 150 and time["mean_response_tokens"] == 50
    assert "mean prompt 100, response 50" in capsys.readouterr().out
    code = cli_main(["plan", "vcppo", "--model-shape", "qwen2.5-0.5b", "--measure", "model.policy_path=/nope"])
    err = capsys.readouterr().err
    assert code == 2 and "model.policy_path" in err and "--measure" in err and "Traceback" not in err
