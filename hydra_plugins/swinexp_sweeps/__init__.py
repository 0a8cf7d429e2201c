"""The named sweeps (`sweeps/` at the top of the repository, `swinexp/_sweeps` in the wheel) as the config group
`sweep`: `python run.py sweep=amp_ablation`, no `+`."""
