"""The distributed runtime under the engines and the driver: the launcher's environment
(launch_env.py), the process groups, the process's exit and teardown (dist.py), the collectives
(collectives.py), split placement's transport (bridge.py) and whether a process ends with its command
(lifetime.py). See docs/launching.md."""
