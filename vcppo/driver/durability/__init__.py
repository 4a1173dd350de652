"""The run's durability: checkpoints and resume (on the same or another number of ranks), the manifest,
the pretrained critic cache, the run lock, the config a resume may change, and the guards that stop a
run that goes wrong before it overwrites what was good."""
