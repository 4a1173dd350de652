"""The commands that are not the RL driver: `vcppo sft`, `vcppo rm`, `vcppo eval` (each a `main(argv)`).

They reuse the driver's wiring (:mod:`vcppo.driver.context`) and the engines; `vcppo train` is the
driver itself (:mod:`vcppo.driver.ppo`)."""
