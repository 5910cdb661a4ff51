"""One node's round, above the three ports.

:mod:`.learner` (tasks, generator, verifier and trainer for one model), :mod:`.sampler`
(the pure I/J selection), :mod:`.loop` (the round loop: generate, publish, collect,
sample, train, commit), :mod:`.checkpoint`, :mod:`.report` (what a round reports) and
:mod:`.swarm` (assembling a node from settings and the process's embedded services).
Imports the fabric, the ledger and the policy; none of them imports it.
"""
