"""Resuming on another number of ranks, the decisions before any engine starts: which engine
checkpoints need DeepSpeed's universal format, which ZeRO stages can load them, what split
placement refuses, and that no file outside the manifest is read."""
import pytest

from vcppo.config.load import load_config
from vcppo.config.placement import Placement
from vcppo.driver.durability import manifest
from vcppo.driver.durability.checkpoint import CheckpointError, write_rank_files
from vcppo.driver.durability.conversion import (_check_only_listed_files, check_stages, plan_reshard, prepare,
                                  written_world_size)


def _checkpoint(root, ranks=2, stages=None):
    """A sealed-looking checkpoint: RNG files of ``ranks`` ranks, engine dirs laid out as DeepSpeed
    writes them at ``stages`` ({role: stage}), and a manifest listing every file."""
    point = root / "step_000004"
    for rank in range(ranks):
        write_rank_files(point, rank)
    for role, stage in (stages or {"actor": 3, "critic": 3}).items():
        ds = point / role / "ds"
        ds.mkdir(parents=True)
        if stage == 0:
            (ds / "mp_rank_00_model_states.pt").write_bytes(b"x")
        for rank in range(ranks if stage else 0):
            kind = "zero_pp_rank_{}_mp_rank_00_model_states.pt" if stage == 3 else "bf16_zero_pp_rank_{}_mp_rank_00_optim_states.pt"
            (ds / kind.format(rank)).write_bytes(b"x")
            if stage == 3:
                (ds / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"x")
    manifest.write_manifest(point, [manifest.hash_share(point)])
    return point


def test_the_world_size_a_checkpoint_was_written_on(tmp_path):
    assert written_world_size(_checkpoint(tmp_path, ranks=2)) == 2
    (tmp_path / "empty").mkdir()
    assert written_world_size(tmp_path / "empty") is None


def test_same_world_size_needs_nothing(tmp_path):
    point = _checkpoint(tmp_path, ranks=2)
    assert prepare(point, tmp_path, load_config("vcppo"), True, 2, lambda x: [x], Placement.of(load_config("vcppo"))) == {}


def test_only_zero_1_to_3_engines_are_converted(tmp_path):
    point = _checkpoint(tmp_path, stages={"actor": 3, "critic": 0})
    assert plan_reshard(point, tmp_path) == {"actor": tmp_path / "universal" / "step_000004" / "actor"}
    point2 = _checkpoint(tmp_path / "b", stages={"actor": 2})
    assert list(plan_reshard(point2, tmp_path)) == ["actor"]


def test_a_stage_that_cannot_load_the_checkpoint_is_named(tmp_path):
    point = _checkpoint(tmp_path, stages={"actor": 3, "critic": 0})
    check_stages(point, {"actor": 3, "critic": 0}, 2, 1)  # each at a stage its checkpoint loads into
    with pytest.raises(CheckpointError, match=r"actor at ZeRO-3 on 2 rank\(s\); on 1 it can resume at ZeRO-1/2/3 "
                                              r"only, not actor.zero_stage=0"):
        check_stages(point, {"actor": 0, "critic": 0}, 2, 1)
    with pytest.raises(CheckpointError, match=r"critic at ZeRO-0 .* at ZeRO-0 only, not critic.zero_stage=3"):
        check_stages(point, {"actor": 3, "critic": 3}, 2, 1)
    cfg = load_config("vcppo", ["actor.zero_stage=0"])
    with pytest.raises(CheckpointError, match="actor.zero_stage=0"):
        prepare(point, tmp_path, cfg, True, 1, lambda x: [x], Placement.of(cfg))


def test_split_placement_resumes_on_its_own_shape_only(tmp_path):
    point = _checkpoint(tmp_path, ranks=2)
    cfg = load_config("vcppo", ["placement.mode=split"])
    with pytest.raises(CheckpointError, match=r"written by 2 training rank\(s\) and this split run has 3"):
        prepare(point, tmp_path, cfg, True, 3, lambda x: [x], Placement.of(cfg))


def test_a_file_the_manifest_does_not_list_is_never_read(tmp_path):
    point = _checkpoint(tmp_path)
    _check_only_listed_files(point, "actor")
    planted = point / "actor" / "ds" / "zero_pp_rank_7_mp_rank_00_optim_states.pt"
    planted.write_bytes(b"code")
    with pytest.raises(CheckpointError, match="zero_pp_rank_7.*not in the checkpoint's manifest"):
        _check_only_listed_files(point, "actor")
    with pytest.raises(CheckpointError, match="zero_pp_rank_7"):  # and prepare says so on every rank
        prepare(point, tmp_path, load_config("vcppo"), True, 1, lambda x: [x], Placement.of(load_config("vcppo")))
