"""Finding modules as a user writes them, imported by `harness.run --findings-module`."""
