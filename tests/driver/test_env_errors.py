"""The step's one line on its env errors, and the text guard at the tokenizer's door."""
from vcppo.driver.step.env_errors import readable, step_summary


def test_the_step_line_counts_failures_and_unreadable_text_and_names_the_first_error():
    line = step_summary("PPO step 3", "tools", {"env/failures": 2.0, "env/text_errors": 1.0, "env/episodes": 8.0},
                       "failed at turn 1, ...: error: KeyError('answer')")
    assert line == ("PPO step 3: env 'tools': 2 of 8 episodes ended by env errors, 1 observations not valid Unicode; "
                    "first: failed at turn 1, ...: error: KeyError('answer')")
    assert step_summary("PPO step 4", "tools", {"env/failures": 0.0, "env/text_errors": 0.0, "env/episodes": 8.0},
                        None) is None


def test_text_the_tokenizer_cannot_encode_is_escaped_and_said():
    assert readable("plain, ünïcode") == ("plain, ünïcode", True)
    assert readable("a \ud800 b \udcff") == ("a \\ud800 b \\udcff", False)
