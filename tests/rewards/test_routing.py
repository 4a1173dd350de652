"""data_source picks the reward function per row, and the row's reward info (data_source,
extra_info) reaches custom reward functions, serially and in the worker pool."""
import pickle

import pytest

from vcppo.config.load import load_config
from vcppo.preflight import check_paths
from vcppo.rewards.routing import GroundTruth, RewardRouter
from vcppo.rewards.verifier import RewardScorer
from vcppo.errors import ConfigError

T = "<think>\n1+2+0=3\n</think>\n"

HELPERS = '''
def by_index(text, truth, **info):
    """The row's extra_info.index, so a test sees which row's info arrived."""
    return float(info["extra_info"]["index"])

def length_reward(text, truth, data_source=None, finish_reason=None, **info):
    assert data_source == "lengthy", data_source
    return float(len(text)) + (0.5 if truth == "3" else 0.0)
'''


@pytest.fixture()
def helpers(reward_module):
    return reward_module("vcppo_routing_helpers", HELPERS)


def batch():
    sources = ["indexed", "lengthy", "gsm8k_unknown", None, "indexed"]
    truths = [GroundTruth("3", {"data_source": s, "extra_info": {"index": i}}) for i, s in enumerate(sources)]
    texts = [T + "\\boxed{3}", T + "\\boxed{3}", T + "\\boxed{3}", T + "\\boxed{4}", T]
    return texts, truths, ["stop"] * 5


@pytest.mark.parametrize("num_workers", [0, 2])
def test_data_source_picks_the_function_and_info_reaches_it(helpers, num_workers):
    scorer = RewardScorer(functions_by_source={"indexed": f"{helpers}:by_index", "lengthy": f"{helpers}:length_reward"},
                          correct=2.0, wrong=-3.0, num_workers=num_workers, timeout_s=30)
    try:
        rewards, metrics = scorer(*batch())
    finally:
        scorer.close()
    # indexed rows: their extra_info.index; lengthy: its own rule (and the plain answer text);
    # unknown source and no source: the built-in verifier with the configured scores
    assert rewards == [0.0, len(T + "\\boxed{3}") + 0.5, 2.0, -3.0, 4.0]
    assert metrics["reward/num_failures"] == 0.0


def test_unknown_sources_fall_back_to_reward_function(helpers):
    scorer = RewardScorer(f"{helpers}:by_index", functions_by_source={"lengthy": f"{helpers}:length_reward"})
    rewards, _ = scorer(*batch())
    assert rewards[0] == 0.0 and rewards[2] == 2.0 and rewards[3] == 3.0 and rewards[1] > 10


def test_without_routing_the_info_still_reaches_reward_function(helpers):
    rewards, _ = RewardScorer(f"{helpers}:by_index", num_workers=0)(*batch())
    assert rewards == [0.0, 1.0, 2.0, 3.0, 4.0]
    plain, _ = RewardScorer()([T + "\\boxed{3}"], [GroundTruth("3", {"data_source": "x", "extra_info": {}})])
    assert plain == [1.0]  # the built-in verifier ignores the extra fields


def test_a_bad_path_fails_at_start_up_and_in_the_config_check(tmp_path):
    with pytest.raises(ImportError, match="no_such_module"):
        RewardScorer(functions_by_source={"a": "no_such_module:fn"})
    cfg = load_config("base", ["reward.functions_by_source.gsm8k=vcppo.rewards.verifier:no_fn",
                               f"eval.model_path={tmp_path}", f"eval.data_files={tmp_path}"])
    with pytest.raises(ConfigError, match=r"config key 'reward.functions_by_source.gsm8k': cannot load"):
        check_paths(cfg, "eval")


def test_ground_truth_and_router_pickle_for_the_workers(helpers):
    truth = pickle.loads(pickle.dumps(GroundTruth("42", {"data_source": "a"})))
    assert truth == "42" and truth.reward_info == {"data_source": "a"} and isinstance(truth, str)
    router = RewardRouter({"indexed": f"{helpers}:by_index"})
    router.load_all()
    copy = pickle.loads(pickle.dumps(router))
    assert copy.by_source == router.by_source and copy._loaded == {}
    assert copy(T, "3", data_source="indexed", extra_info={"index": 7}) == 7.0
