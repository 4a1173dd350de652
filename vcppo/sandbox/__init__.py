"""Model-written code in a sandbox (:mod:`vcppo.sandbox.bwrap`): what the tools env's ``python`` tool
and the code-execution reward (:mod:`vcppo.rewards.code`) run programs in."""
