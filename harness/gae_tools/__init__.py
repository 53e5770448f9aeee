"""GAE-specific commands: re-measure `auto`'s crossover table
(`python -m harness.gae_tools.crossovers`) and check our best GAE against its peers
and targets (`python -m harness.gae_tools.targets`).
"""
