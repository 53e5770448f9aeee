"""GAE-specific commands: re-measure `auto`'s crossover table
(`python -m esper_review.gae_tools.crossovers`), check our best GAE against its peers
and targets (`python -m esper_review.gae_tools.targets`), and time the small calls against
their dispatch floor (`python -m esper_review.gae_tools.floor`).
"""
