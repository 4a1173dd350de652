"""Text environments for multi-turn episodes, in gymnasium's shape (docs/multiturn.md).

:mod:`vcppo.envs.base` is the API (``reset(row, seed)`` / ``step(action_text)``) and the registry
(``rollout.env``: a built-in name or ``"module:Class"``); :mod:`vcppo.envs.guess` and
:mod:`vcppo.envs.tools` are the built-in environments; :mod:`vcppo.envs.worker` runs an env turn in
the isolated worker pool, where user code cannot take the trainer down.
"""
