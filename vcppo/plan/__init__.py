"""`vcppo plan`: whether a run fits its GPUs and roughly how long a step takes, before it is queued.

Pure arithmetic from the model's shape, the config and datasheet figures of the GPU; nothing here
imports torch or starts an engine. :mod:`vcppo.plan.shape` (model shapes, parameter counts, GPU
specs), :mod:`vcppo.plan.memory` (bytes per GPU of every role), :mod:`vcppo.plan.timing` (seconds
per step), :mod:`vcppo.plan.advise` (the verdicts and the knob that makes a run fit).
"""
