"""`vcppo bench split`'s arithmetic and drawing on hand-made runs (the real runs are the benchmark)."""
import json

import pytest

from vcppo.bench import split
from vcppo.config.load import load_config


def _run_dir(tmp_path, name="run"):
    d = tmp_path / name
    (d / "timeline").mkdir(parents=True)
    recs = [{"phase": "value_pretrain", "step": k, "time": 10.0 + k} for k in (1, 2, 3)]  # 1 step/s
    recs += [{"phase": "ppo", "step": k, "time": 100.0 + 10 * k, "perf/response_tokens": 40.0} for k in (1, 2, 3)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    rows = {0: [("critic_update", 105, 112), ("actor_update", 112, 125)],  # crosses the window's end (130)
            1: [("sample", 95, 118), ("receive_weights", 120, 120.5), ("load_weights", 120.5, 121),
                ("receive_weights", 128, 129), ("wait", 129, 140)]}
    for rank, spans in rows.items():
        (d / "timeline" / f"rank{rank}.jsonl").write_text("".join(
            json.dumps({"rank": rank, "role": "train" if rank == 0 else "rollout", "name": n, "start": a, "end": b})
            + "\n" for n, a, b in spans))
    return d


def test_figures_skip_step_one_and_clip_the_timeline_to_the_window(tmp_path):
    f = split.figures(_run_dir(tmp_path), samples_per_step=8)
    assert f["steps"] == 2 and f["seconds"] == 20.0  # PPO steps 2..3: from step 1's end to step 3's
    assert f["steps_per_hour"] == pytest.approx(360.0) and f["response_tokens_per_s"] == pytest.approx(4.0)
    assert f["mean_response_tokens"] == pytest.approx(5.0)
    assert f["pretrain_steps_per_hour"] == pytest.approx(3600.0)
    # intervals are cut at the window [110, 130]
    assert f["busy_s"]["rank0/critic_update"] == pytest.approx(2.0)
    assert f["busy_s"]["rank0/actor_update"] == pytest.approx(13.0)
    assert f["busy_s"]["rank1/sample"] == pytest.approx(8.0) and f["busy_s"]["rank1/wait"] == pytest.approx(1.0)
    assert f["weight_transfer"] == {"count": 2, "mean_s": pytest.approx(0.75)}


def test_summary_ratios_against_colocated_and_the_transfer_against_a_copy(tmp_path):
    from safetensors.torch import save_file
    import torch
    runs = {"colocated": [{"steps_per_hour": 100.0, "response_tokens_per_s": 10.0}] * 2,
            "split1": [{"steps_per_hour": 120.0, "response_tokens_per_s": 9.0, "pretrain_steps_per_hour": 50.0,
                        "weight_transfer": {"count": 1, "mean_s": 0.5}},
                       {"steps_per_hour": 140.0, "response_tokens_per_s": 11.0, "pretrain_steps_per_hour": 70.0,
                        "weight_transfer": {"count": 3, "mean_s": 0.1}}]}
    s = split._summarise(runs)
    assert s["colocated"]["vs_colocated"] == 1.0 and s["split1"]["vs_colocated"] == pytest.approx(1.3)
    assert s["split1"]["pretrain_steps_per_hour"] == pytest.approx(60.0) and s["colocated"]["pretrain_steps_per_hour"] is None
    (tmp_path / "m").mkdir()
    save_file({"w": torch.zeros(1000), "b": torch.zeros(24, dtype=torch.bfloat16)}, str(tmp_path / "m" / "model.safetensors"))
    t = split._transfer_figures(runs, tmp_path / "m")
    assert t["bytes"] == 4048 and t["receive_s"] == pytest.approx(0.2)  # weighted by transfers: (0.5 + 3 x 0.1) / 4
    assert t["plain_copy_s"] > 0


def test_draw_writes_one_panel_per_mode(tmp_path):
    runs = {"colocated": _run_dir(tmp_path, "a"), "split1": _run_dir(tmp_path, "b")}
    split.draw(runs, {m: [110.0, 130.0] for m in runs}, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_every_mode_runs_a_config_that_loads(tmp_path):
    args = split._parse(["--workdir", str(tmp_path), "--pretrain-steps", "3"])
    for mode in split.MODES:
        cmd = split.run_command(args, mode, tmp_path / mode)
        processes = 3 if mode == "split1c" else 2  # a critic rank beside the training rank
        assert cmd[1:4] == ["-m", "torch.distributed.run", f"--nproc_per_node={processes}"]
        train = cmd.index("train")
        cfg = load_config(cmd[train + 1], cmd[train + 2:])
        assert cfg.value_pretrain.steps == 3 and cfg.logging.timeline
        assert cfg.placement.mode == ("colocated" if mode == "colocated" else "split")
        assert cfg.placement.critic_ranks == (1 if mode == "split1c" else 0)
    with pytest.raises(SystemExit):
        split._parse(["--modes", "colocated,split9"])
