"""`vcppo demo demo_real`'s pipeline (a pretrained model, no SFT): the stages it runs, in order, with
the arguments `make demo-real` gives them, and what it skips on a second call. The stages are
recorded here instead of run; `make test-real` runs them for real on SmolLM2."""
import json
from pathlib import Path

import pytest

from vcppo.commands import demo
from vcppo.preflight import load_command_config


def _fake_run(calls, run_dir: Path):
    def run(stage, args, log):
        calls.append((stage, args))
        log.append({"stage": stage})
        out = next((a.split("=", 1)[1] for a in args if a.startswith("eval.output_json=")), None)
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps({"val/pass@1_greedy": 0.5, "val/pass@1": 0.25,
                                             "val/response_length_sampled": 30.0}))
        if stage == "train":
            (run_dir / "final_metrics.json").write_text("{}")
        if stage == "model":
            (Path(args[-1]) / "config.json").parent.mkdir(parents=True)
            (Path(args[-1]) / "config.json").write_text("{}")
    return run


def test_real_pipeline_stages_and_a_second_call_reruns_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_command_config(["demo_real", f"demo.workdir={tmp_path}/w", f"trainer.output_root={tmp_path}/runs"],
                              "demo", default_config="demo")
    run_dir = demo.run_dir_of(cfg)
    run_dir.mkdir(parents=True)
    calls = []
    monkeypatch.setattr(demo, "_run", _fake_run(calls, run_dir))
    figures = demo.real_pipeline(cfg, "C.yaml", [])
    stages = [s for s, _ in calls]
    digits, words = "heldout-arith-3-2", "heldout-arith_words-2-3"
    assert stages == ["model", "data", f"data-{digits}", f"data-{words}", "eval-base-test", f"eval-base-{digits}",
                      f"eval-base-{words}", "train", "eval-rl-test", f"eval-rl-{digits}", f"eval-rl-{words}"]
    args = dict(calls)
    assert args["model"] == ["model", "fetch", "smollm2-135m-instruct", "--out", f"{tmp_path}/w/smollm2"]
    assert args["data"][:8] == ["data", "make", "--task", "arith", "--difficulty", "2", "--operands", "2"]
    assert args[f"data-{digits}"][2:8] == ["--task", "arith", "--difficulty", "3", "--operands", "2"]
    assert args[f"data-{words}"][2:8] == ["--task", "arith_words", "--difficulty", "2", "--operands", "3"]
    assert args[f"data-{words}"][8:] == ["--split", "test", "--n", "128", "--format", "verl", "--out",
                                         f"{tmp_path}/w/data/{words}.parquet"]
    assert f"eval.model_path={run_dir}/final/actor" in args[f"eval-rl-{words}"]
    assert f"eval.data_files={tmp_path}/w/data/{words}.parquet" in args[f"eval-rl-{words}"]
    assert set(figures) == {"base", "rl"} and set(figures["rl"]) == {"test", digits, words}
    # everything written: a second call only reads (data files exist as the real stage would leave them)
    (tmp_path / "w" / "data").mkdir(parents=True)
    for name in ("train", digits, words):
        (tmp_path / "w" / "data" / f"{name}.parquet").write_text("")
    calls.clear()
    demo.real_pipeline(cfg, "C.yaml", [])
    assert calls == []


@pytest.mark.parametrize("value", ["arith_words:3", "arith:x:2", "a:1:2:3"])
def test_a_malformed_heldout_is_one_line(value):
    with pytest.raises(SystemExit, match="demo.heldout: expected 'TASK:DIFFICULTY:OPERANDS'"):
        demo.heldout_spec(value)



@pytest.mark.parametrize("flags,native", [("fpu avx2 avx512f avx512_bf16", True), ("fpu avx2 amx_bf16", True),
                                          ("fpu avx2 fma", False)])
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, flags, native):
    from vcppo.engines.engine_setup import cpu_has_native_bf16

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert cpu_has_native_bf16(str(info)) is native
    assert cpu_has_native_bf16(str(tmp_path / "missing")) is False


@pytest.mark.parametrize("native,expected", [(True, "bfloat16"), (False, "float32")])
def test_demo_real_trains_in_bf16_only_where_the_cpu_has_it(monkeypatch, capsys, native, expected):
    from vcppo.engines import engine_setup

    monkeypatch.setattr(engine_setup, "cpu_has_native_bf16", lambda: native)
    cfg = demo.cpu_dtype(load_command_config(["demo_real"], "demo", default_config="demo"))
    assert cfg.model.dtype == expected
    assert ("no native bf16" in capsys.readouterr().out) is not native
