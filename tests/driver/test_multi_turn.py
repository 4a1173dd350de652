"""The episode runner on a scripted sampler (milliseconds): a trained episode's token ids are its
sampled ids plus its observation ids (nothing decoded and re-encoded), the policy mask holds the
model tokens, each turn's reward sits on its last model token, the limits cut and mark, a failing
env ends its episode as a counted failure, and observations follow the chat template."""
import pytest
import torch

from vcppo.data import tasks_guess
from vcppo.data.dataset import encode_prompt
from vcppo.driver.step.multi_turn import EpisodeRunner, ObservationEncoder, episodes_rollout
from vcppo.engines.rollout import RolloutSample
from vcppo.envs.worker import EnvRunner
from vcppo.models.tokenizer import build_tokenizer
from vcppo.config.schema import Config

TOK = build_tokenizer()


class ScriptedSampler:
    """Answers each turn's contexts with scripted texts (encoded, ending with <|im_end|>), and keeps
    what it was asked."""

    def __init__(self, turns: list[list[str]], cut: set = frozenset()):
        self.tokenizer, self.turns, self.cut, self.calls = TOK, turns, cut, []

    def generate(self, prompts, n, temperature, top_p, max_tokens, stop=None, seed=None, logprobs=True,
                 reset_cache=True):
        turn = len(self.calls)
        self.calls.append({"prompts": [list(p) for p in prompts], "max_tokens": max_tokens, "reset": reset_cache})
        out = []
        for i, text in enumerate(self.turns[turn][:len(prompts)]):
            ids = TOK.encode(text, add_special_tokens=False)
            cut = (turn, i) in self.cut  # the model runs on without an end-of-turn until its budget
            budget = max_tokens[i] if isinstance(max_tokens, list) else max_tokens
            ids = (ids + TOK.encode("x" * budget, add_special_tokens=False))[:budget] if cut else ids + [TOK.eos_token_id]
            out.append(RolloutSample(i, list(prompts[i]), ids, [-0.1 * (k + 1) for k in range(len(ids))],
                                     "length" if cut else "stop", text))
        return out


def cfg_for(**rollout) -> Config:
    cfg = Config()
    cfg.rollout.env, cfg.rollout.env_args = "guess", {"n": 16, "max_turns": 4}
    for k, v in rollout.items():
        setattr(cfg.rollout, k, v)
    return cfg


def rows(*answers):
    prompt = encode_prompt(TOK, "guess 1-16 in 4", use_chat_template=True)
    return [{"prompt_ids": list(prompt), "answer": a} for a in answers]


def test_token_ids_are_the_sampled_ids_plus_the_observation_ids():
    sampler = ScriptedSampler([["<think>1-16</think>8", "<think>1-16</think>8"],
                               ["<think>9-16</think>12", "<think>1-7</think>3"],
                               ["<think>9-11</think>10"]])
    runner = EpisodeRunner(cfg_for(), sampler, EnvRunner(0, 5.0), max_model_len=512)
    done = runner.run(rows("10", "3"), n=1, seed=0, key="ppo", temperature=1.0, logprobs=True)
    encode = ObservationEncoder(TOK)
    eos = [TOK.eos_token_id]
    turn = lambda text: TOK.encode(text, add_special_tokens=False) + eos  # noqa: E731
    want0 = (turn("<think>1-16</think>8") + encode("higher") + turn("<think>9-16</think>12") + encode("lower")
             + turn("<think>9-11</think>10"))
    want1 = turn("<think>1-16</think>8") + encode("lower") + turn("<think>1-7</think>3")
    assert done[0].tokens == want0 and done[1].tokens == want1
    # each turn's context was exactly the prompt plus everything so far: no re-tokenized text
    assert sampler.calls[1]["prompts"][0] == rows("10")[0]["prompt_ids"] + turn("<think>1-16</think>8") + encode("higher")
    assert [c["reset"] for c in sampler.calls] == [True, False, False]  # the prefix cache kept between turns
    batch = episodes_rollout(done, first_index=0, pad_id=0, device="cpu", logprobs=True)
    P = batch.prompt_len
    assert batch.input_ids[0, P:P + len(want0)].tolist() == want0
    policy = [1.0] * len(turn("<think>1-16</think>8")) + [0.0] * len(encode("higher"))
    assert batch.policy_mask[0, :len(policy)].tolist() == policy
    assert batch.attention_mask[0, P:P + len(want0)].sum() == len(want0)  # the passes read every token
    ends = [len(turn("<think>1-16</think>8")) - 1, len(want0) - 1]
    assert batch.token_rewards[0].nonzero().flatten().tolist() == [ends[1]] and batch.scores.tolist() == [1.0, 1.0]
    assert batch.sampler_logprobs[0, len(policy) - 1].item() == 0.0  # none at an observation token
    assert batch.correct.tolist() == [1.0, 1.0] and batch.truncated.tolist() == [0.0, 0.0]


def test_per_turn_rewards_on_each_turns_last_model_token():
    sampler = ScriptedSampler([["8"], ["12"], ["10"]])
    cfg = cfg_for(env_args={"n": 16, "max_turns": 4, "shaped": True, "step_penalty": -0.25})
    done = EpisodeRunner(cfg, sampler, EnvRunner(0, 5.0), 512).run(rows("10"), 1, 0, "ppo", 1.0, False)
    batch = episodes_rollout(done, 0, 0, "cpu", logprobs=False)
    model = batch.policy_mask[0].nonzero().flatten().tolist()
    turn_ends = [i for i in model if i + 1 not in model]
    assert batch.token_rewards[0, turn_ends].tolist() == [-0.25, -0.25, 1.0]
    assert batch.token_rewards[0].sum().item() == pytest.approx(0.5) and batch.scores.item() == pytest.approx(0.5)


def test_limits_cut_and_mark():
    cut = EpisodeRunner(cfg_for(max_response_tokens=40), ScriptedSampler([["8"], ["12"]], cut={(1, 0)}),
                        EnvRunner(0, 5.0), 512)
    e = cut.run(rows("10"), 1, 0, "ppo", 1.0, False)[0]
    assert e.truncated and e.turns == 2 and not e.solved and len(e.tokens) == 40  # the episode's budget ran out
    turns = EpisodeRunner(cfg_for(max_turns=2), ScriptedSampler([["8"], ["12"]]), EnvRunner(0, 5.0), 512)
    e = turns.run(rows("10"), 1, 0, "ppo", 1.0, False)[0]
    assert e.truncated and e.turns == 2 and e.tokens[-1] == TOK.eos_token_id  # ends on a model token
    sampler = ScriptedSampler([["8"], ["12"], ["10"]], cut={(1, 0)})
    e = EpisodeRunner(cfg_for(turn_max_tokens=7), sampler, EnvRunner(0, 5.0), 512).run(rows("10"), 1, 0, "ppo", 1.0,
                                                                                          False)[0]
    assert sampler.calls[0]["max_tokens"] == [7]
    # a turn cut at rollout.turn_max_tokens is answered ("12xxxxx" reads as 12): the episode goes on
    assert e.turns == 3 and e.solved and not e.truncated
    assert sampler.calls[2]["prompts"][0][-len(ObservationEncoder(TOK)("lower", closed=False)):] == \
        ObservationEncoder(TOK)("lower", closed=False)  # the cut turn closed by the observation frame


def test_a_failing_env_ends_its_episode_counted():
    cfg = cfg_for()
    cfg.rollout.env, cfg.rollout.env_args = "tests.envs.hostile:Raises", {}
    envs = EnvRunner(0, 5.0)
    e = EpisodeRunner(cfg, ScriptedSampler([["8"]]), envs, 512).run(rows("10"), 1, 0, "ppo", 1.0, False)[0]
    assert e.failed and e.done and envs.num_failures == 1 and e.rewards == [(len(e.tokens) - 1, cfg.reward.wrong_score)]


def test_observation_frame_follows_the_chat_template():
    encode = ObservationEncoder(TOK)
    assert encode("higher") == TOK.encode(tasks_guess.USER_TURN.format(obs="higher"), add_special_tokens=False)
    # a turn that stopped on a stop string (no end-of-turn token) is closed first
    assert encode("x", closed=False)[0] == TOK.eos_token_id
    no_template = build_tokenizer()
    no_template.chat_template = None
    assert ObservationEncoder(no_template)("hi") == no_template.encode("\nhi\n", add_special_tokens=False)


def test_sft_demonstrations_tokenize_like_the_episodes():
    """A guess row's SFT target is the episode the runner would build from the same turns."""
    row = {"solution": "<think>1-16</think>8" + tasks_guess.IM_END + tasks_guess.USER_TURN.format(obs="higher")
                       + "<think>9-16</think>12"}
    encode = ObservationEncoder(TOK)
    episode = (TOK.encode("<think>1-16</think>8", add_special_tokens=False) + [TOK.eos_token_id] + encode("higher")
               + TOK.encode("<think>9-16</think>12", add_special_tokens=False))
    assert TOK.encode(row["solution"], add_special_tokens=False) == episode
    assert torch.tensor(episode).numel() > 0


def test_episode_metrics_per_episode_and_shares():
    from vcppo.driver.step.multi_turn import episode_metrics, summed_episode_metrics
    sampler = ScriptedSampler([["8", "8"], ["12", "3"], ["10"]])
    done = EpisodeRunner(cfg_for(), sampler, EnvRunner(0, 5.0), 512).run(rows("10", "3"), 1, 0, "ppo", 1.0, False)
    figures = episode_metrics(done, env_seconds=0.5)
    figures["env/rollout_seconds"] = 2.0
    m = summed_episode_metrics(figures)
    obs = sum(len(e.tokens) - sum(e.policy) for e in done)
    assert m["env/turns_mean"] == 2.5 and m["env/failures"] == 0 and m["time/env_s"] == 0.5
    assert m["env/obs_token_frac"] == pytest.approx(obs / sum(len(e.tokens) for e in done))


def test_validation_reports_the_share_of_episodes_that_called_a_tool():
    """vcppo eval on tool episodes. Greedy: one episode calls the calculator and then answers right, the other
    answers at once, wrongly; sampled: both call, one answers right. pass@1 counts the env's verdicts and
    val/tool_use_* the episodes with a call, over the split and per group."""
    from vcppo.driver.step.sampler import EpisodeSampler
    from vcppo.driver.step.validation import evaluate
    from vcppo.runtime.dist import DistInfo
    cfg = cfg_for()
    cfg.rollout.env, cfg.rollout.env_args = "tools", {"tools": ["calculator"], "max_turns": 4}
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>'
    greedy = [[call, "<think>\n</think>\n\\boxed{8}"], ["<think>\n</think>\n\\boxed{7}"]]  # 3+4 -> 7
    sampled = [[call, call], ["<think>\n</think>\n\\boxed{7}", "<think>\n</think>\n\\boxed{6}"]]  # both call
    sampler = ScriptedSampler(greedy + sampled)
    prompt = encode_prompt(TOK, "sum(3,4)=?", use_chat_template=True)
    val_rows = [{"prompt_ids": list(prompt), "answer": "7"}, {"prompt_ids": list(prompt), "answer": "7"}]
    runner = EpisodeRunner(cfg, sampler, EnvRunner(0, 5.0), 512)
    one = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", is_main=True)
    m = evaluate(EpisodeSampler(cfg, runner, None, 0, "cpu", False), val_rows, dist=one, sampling=cfg.rollout,
                 n_samples=1, ks=[1], groups=["a", "b"])
    assert m["val/pass@1_greedy"] == 0.5 and m["val/tool_use_greedy"] == 0.5
    assert m["val/pass@1"] == 0.5 and m["val/tool_use_sampled"] == 1.0  # one sample each, both called
    assert (m["val/a/tool_use_greedy"], m["val/b/tool_use_greedy"]) == (1.0, 0.0)  # per group too


def test_an_unsandboxed_python_tool_is_said_in_the_log_once(capsys):
    """rollout.env_args.allow_unsandboxed_python (from the config or a row): one warning line per run."""
    cfg = cfg_for()
    cfg.rollout.env, cfg.rollout.env_args = "tools", {"tools": ["calculator"], "max_turns": 2}
    runner = EpisodeRunner(cfg, ScriptedSampler([]), EnvRunner(0, 5.0), 512)
    runner.start(rows("7"), 2, 0, "ppo")
    assert "UNSANDBOXED" not in capsys.readouterr().out
    from vcppo.rewards.routing import GroundTruth
    info = {"extra_info": {"env_args": {"allow_unsandboxed_python": True}}}  # a row's own env arguments
    unsandboxed = [{**r, "answer": GroundTruth(r["answer"], info)} for r in rows("7", "8")]
    runner.start(unsandboxed, 2, 0, "ppo")
    runner.start(unsandboxed, 2, 1, "ppo")
    assert capsys.readouterr().out.count("allow_unsandboxed_python=true: the python tool runs model-written code "
                                         "UNSANDBOXED") == 1


def test_unreadable_text_from_the_policy_or_the_env_is_a_counted_error_not_a_crash(caplog):
    """A JSON escape the policy can write ("\\ud800") comes back in the tool's answer as a lone
    surrogate, and an env may answer with one (or with bytes read by surrogateescape): the tokenizer
    cannot encode either. The policy reads the text escaped; each counts in env/text_errors."""
    from vcppo.driver.step.multi_turn import episode_metrics
    cfg = cfg_for()
    cfg.rollout.env, cfg.rollout.env_args = "tools", {"tools": ["calculator"], "max_turns": 4}
    call = '<tool_call>{"name": "calculator", "arguments": {"\\ud800": 1}}</tool_call>'
    sampler = ScriptedSampler([[call], ["<think>\n</think>\n\\boxed{7}"]])
    with caplog.at_level("WARNING"):
        e = EpisodeRunner(cfg, sampler, EnvRunner(0, 5.0), 512).run(rows("7"), 1, 0, "ppo", 1.0, False)[0]
    assert e.turns == 2 and e.solved and not e.failed and e.text_errors == 1
    assert "\\ud800" in TOK.decode(sampler.calls[1]["prompts"][0])  # the escape, as the policy wrote it
    assert "env 'tools'" in caplog.text and "turn 1" in caplog.text
    cfg.rollout.env, cfg.rollout.env_args = "tests.envs.hostile:Surrogate", {}
    sampler = ScriptedSampler([["a"], ["b"]])
    e = EpisodeRunner(cfg, sampler, EnvRunner(0, 5.0), 512).run(rows("7"), 1, 0, "ppo", 1.0, False)[0]
    assert e.turns == 2 and not e.failed and e.text_errors == 1 and e.rewards[-1][1] == 1.0
    assert "half \\ud800 pair" in TOK.decode(sampler.calls[1]["prompts"][0])
    assert episode_metrics([e], 0.0)["env/text_errors"] == 1.0


def test_env_errors_are_logged_with_the_env_the_turn_and_the_message(caplog):
    cfg = cfg_for()
    cfg.rollout.env, cfg.rollout.env_args = "tests.envs.hostile:Raises", {}
    with caplog.at_level("WARNING"):
        EpisodeRunner(cfg, ScriptedSampler([["8"] * 8]), EnvRunner(0, 5.0), 512).run(
            rows("10"), 8, 0, "ppo", 1.0, False)
    lines = [r.getMessage() for r in caplog.records if "tests.envs.hostile:Raises" in r.getMessage()]
    assert 1 <= len(lines) <= 5  # the first few, not one per episode
    assert "turn 1" in lines[0] and "the env broke" in lines[0]


@pytest.mark.parametrize("env,says", [("Unseeded", True), ("Fine", False)])
def test_a_user_env_that_is_not_deterministic_is_said_once(env, says, caplog):
    """At its first episodes a user env replays one episode on a fresh instance: one line when the
    answer differs (a resumed run would not repeat its episodes), nothing when it agrees."""
    cfg = cfg_for()
    cfg.rollout.env, cfg.rollout.env_args = f"tests.envs.hostile:{env}", {}
    runner = EpisodeRunner(cfg, ScriptedSampler([["a", "b"], ["c", "d"], ["e", "f"]] * 2), EnvRunner(0, 5.0), 512)
    with caplog.at_level("WARNING"):
        runner.run(rows("1", "2"), 1, 0, "ppo", 1.0, False)
        runner.run(rows("1", "2"), 1, 1, "ppo", 1.0, False)  # checked once
    lines = [r.getMessage() for r in caplog.records if "not deterministic" in r.getMessage()]
    assert len(lines) == (1 if says else 0) and runner.replay_checked
    assert not says or f"tests.envs.hostile:{env}" in lines[0]
