"""The command layer: every `vcppo <command>`'s entry, a module with ``main(argv)`` that
:mod:`vcppo.cli` dispatches to (train, sft, rm, eval, plan, demo, data, model, report, sweep;
`vcppo bench` is the benchmark suite's own dispatcher, :mod:`vcppo.bench`). The work they start
lives below them: the RL driver (:mod:`vcppo.driver`), the engines, the data and model builders."""
