"""GAE-specific commands: re-measure `auto`'s crossover table
(`python -m harness.gae_tools.crossovers`), check our best GAE against its peers
and targets (`python -m harness.gae_tools.targets`), and time the small calls against
their dispatch floor (`python -m harness.gae_tools.floor`).
"""
