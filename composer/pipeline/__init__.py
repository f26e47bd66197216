"""The main job, phase by phase: DATA -> SFT -> EVAL (sft) -> RL -> EVAL (rl) -> SUMMARY.

Each phase leaves its output in the workdir and is skipped when that output is already there, so running
the same command again resumes where a run stopped (a phase interrupted midway resumes from its last
checkpoint). `--mode` runs one phase.
"""
