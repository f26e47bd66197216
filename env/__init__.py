"""env: everything that is not traced: tools, sandboxes, tasks, rewards and the rollout pool."""
