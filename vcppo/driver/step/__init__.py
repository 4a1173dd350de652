"""The step: one RL step as the algorithm reads (rl_step.py), the step plans, advantages, updates, metrics,
where a batch comes from, value pretraining, and the critic as the step meets it."""
