"""`vcppo plan`: whether a run fits its GPUs and roughly how long a step takes, before it is queued.

Arithmetic from the model's shape, the config, datasheet figures of the GPU and a pass model fitted
to one H100's measurements; none of it imports torch or starts an engine, except ``--measure``.
:mod:`vcppo.models.shapes` (model shapes, parameter counts), :mod:`vcppo.plan.hardware` (GPU specs), :mod:`vcppo.plan.memory`
(bytes per GPU of every role), :mod:`vcppo.plan.timing` (seconds per step), :mod:`vcppo.plan.advise`
(the verdicts), :mod:`vcppo.plan.knobs` (the knob that makes a run fit), :mod:`vcppo.plan.measure`
(the training phases timed with the real engines on this machine).
"""
