"""A new placement is one module and one row of vcppo.config.placement.PLACEMENTS: this module is the
module (:class:`Pinned`, implementing the protocol itself), the row is added in the trained process, and
`vcppo train` runs on it end to end; its own config rule refuses a config when it loads.

``Pinned`` places the parts as the colocated placement does (every rank samples and trains in one world,
reusing its source) under a name of its own, with a rule of its own (whole groups of prompts per rank),
and says when each of its parts is asked for, so the test sees the run go through it."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ENV, REPO
from tests.driver.test_train_e2e import base_overrides
from vcppo.config.placement import BOTH, PLACEMENTS, Placement
from vcppo.errors import ConfigError

pytestmark = [pytest.mark.integration]


class Pinned(Placement):
    """Every rank samples and trains, in one world; a step's prompts must split into pairs per rank."""
    name = "pinned"

    def check(self, cfg) -> None:
        if cfg.trainer.prompts_per_step % 2:
            raise ConfigError(f"config key 'trainer.prompts_per_step' ({cfg.trainer.prompts_per_step}) must be even "
                              "with placement.mode=pinned")

    def describe(self) -> str:
        return "pinned placement: every rank samples and trains"

    def init_groups(self, cfg):
        from vcppo.runtime import dist as D
        print("pinned: process groups", file=sys.stderr)
        return D.init_distributed(cfg.trainer.device, **D.timeouts(cfg.trainer))

    def source(self, ctx, plan):
        from vcppo.driver.placement.colocated import ColocatedSource
        ctx.log.info("pinned: experience source")
        return ColocatedSource.for_run(ctx, plan)


ROW = "pinned", "tests.driver.test_placement_table:Pinned"  # the module as the trained process imports it
# the row, added in the process that trains (a subprocess, as `vcppo train` is), then the CLI
TRAIN = ("import sys\nfrom vcppo.config.placement import PLACEMENTS\nPLACEMENTS[{name!r}] = {path!r}\n"
         "from vcppo.cli import main\nsys.exit(main(sys.argv[1:]))")


def test_the_row_makes_a_choice_and_its_rule_applies(monkeypatch):
    from vcppo.config.load import load_config
    monkeypatch.setitem(PLACEMENTS, *ROW)
    cfg = load_config("vcppo", ["placement.mode=pinned"])
    p = Placement.of(cfg)
    assert type(p).__name__ == "Pinned" and p.name == "pinned" and p.samples_on(BOTH) and p.serves() == {} and p.ranks(4) == (4, 4)
    with pytest.raises(ConfigError, match=r"'trainer.prompts_per_step' \(3\) must be even with placement.mode=pinned"):
        load_config("vcppo", ["placement.mode=pinned", "trainer.prompts_per_step=3"])
    load_config("vcppo", ["trainer.prompts_per_step=3"])  # its rule, not colocated's


@pytest.mark.slow
def test_a_dummy_placement_trains_end_to_end_from_one_module_and_one_row(tiny_artifacts, tmp_path):
    cmd = [sys.executable, "-c", TRAIN.format(name=ROW[0], path=ROW[1]), "train", "vcppo",
           *base_overrides(tiny_artifacts, tmp_path, **{"data.val_files": "null"}), "placement.mode=pinned"]
    res = subprocess.run(cmd, cwd=tmp_path, env=dict(ENV, OMP_NUM_THREADS="1", PYTHONPATH=REPO), capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "pinned: process groups" in res.stderr and "pinned: experience source" in res.stderr
    recs = [json.loads(line) for line in (tmp_path / "vcppo-seed0" / "metrics.jsonl").read_text().splitlines()]
    trained = [(r["phase"], r["step"]) for r in recs]
    assert trained == [("value_pretrain", 1), ("value_pretrain", 2), ("ppo", 1), ("ppo", 2)], trained
    assert all("actor/pg_loss" in r for r in recs if r["phase"] == "ppo")  # the actor trained on its samples
    assert (tmp_path / "vcppo-seed0" / "final" / "actor").is_dir()
