"""Structured pruning, written once for every task's model: a channel ratio bisected to a MACs target
(:mod:`pipeline.prune.ratio`), widths per channel group by importance (:mod:`pipeline.prune.channels`) and the
knapsack that chooses them under a budget (:mod:`pipeline.prune.knapsack`)."""
