"""vcppo.config.placement.Placement: what each placement answers (the rank roles, the ranks each part
gets, the checks, the process groups' arguments) from the config alone."""
import pytest

from vcppo.config.load import load_config
from vcppo.config.placement import BOTH, CRITIC, ROLLOUT, TRAIN, Placement
from vcppo.errors import ConfigError


def test_colocated_ranks_do_everything():
    p = Placement.of(load_config("vcppo", []))
    assert not p.split and not p.critic_apart and not p.overlapped and p.rollout_beside_training
    assert p.ranks(8) == (8, 8) and p.dist_args() == {}
    assert p.samples_on(BOTH)
    p.check_ranks(4, 16)
    with pytest.raises(ConfigError, match=r"'trainer.prompts_per_step' \(16\) must be divisible by the number of ranks \(3\)"):
        p.check_ranks(3, 16)


def test_split_gives_the_last_ranks_to_sampling_and_the_middle_to_the_critic():
    p = Placement.of(load_config("vcppo", ["placement.mode=split", "placement.critic_ranks=2",
                                           "trainer.max_staleness=1", "algorithm.rollout_is_cap=2"]))
    assert p.split and p.critic_apart and p.overlapped and not p.rollout_beside_training
    assert p.ranks(5) == (2, 1)  # 2 actor ranks, 2 critic ranks, 1 rollout rank
    assert [p.roles(5).role_of(r) for r in range(5)] == [TRAIN, TRAIN, CRITIC, CRITIC, ROLLOUT]
    assert p.samples_on(ROLLOUT) and not p.samples_on(TRAIN) and not p.samples_on(CRITIC)
    assert p.dist_args() == {"split_rollout_ranks": 1, "split_critic_ranks": 2}
    assert p.describe() == "split placement: 1 rollout rank(s) sample, 2 critic rank(s) hold the critic"
    with pytest.raises(ConfigError, match=r"config key 'placement.critic_ranks' \(2\) must equal the number of actor ranks"):
        p.ranks(6)
    assert not Placement.of(load_config("vcppo", ["placement.mode=split"])).overlapped  # staleness 0
