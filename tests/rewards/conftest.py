"""Reward tests write their custom reward functions into a module on a temporary sys.path entry,
the way a user's `module:function` is found (the pool's workers inherit the parent's sys.path)."""
import sys
import textwrap

import pytest


@pytest.fixture()
def reward_module(tmp_path, monkeypatch):
    """``reward_module(name, source)`` writes module ``name`` and returns its name for
    'name:function' paths; it is dropped from sys.modules afterwards."""
    written = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in written:
        sys.modules.pop(name, None)
