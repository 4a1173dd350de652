"""Whether this process ends as soon as its command returns.

The ``vcppo`` console script (:func:`vcppo.cli.entry`) marks it so. Teardown at the command's end
that only hands memory back to a process that lives on is then left to the OS: vLLM's engine
shutdown unfreezes the garbage collector and scans the whole heap three times, and the
interpreter's own teardown of torch / vLLM follows (:func:`vcppo.runtime.dist.exit_process`; the
cost is measured in docs/history.md). A process that builds engines and carries on (a test, a
notebook) is never marked and keeps the full teardown. No imports here: the mark costs a
command that starts no engine nothing.
"""
_ENDS_AFTER_COMMAND = False


def mark_ends_after_command() -> None:
    global _ENDS_AFTER_COMMAND
    _ENDS_AFTER_COMMAND = True


def ends_after_command() -> bool:
    return _ENDS_AFTER_COMMAND
