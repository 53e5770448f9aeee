"""The project whose claim is measured: a small RL codebase with its own GAE."""
