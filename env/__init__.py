"""env: the IDE side, plain Python and never traced: tools, sandboxes, tasks, grading, the scripted expert,
the rollout pool, and the chat / tool-call format and tokenizer the model shares with the IDE.

Nothing here imports composer/: the model side imports env/.
"""
