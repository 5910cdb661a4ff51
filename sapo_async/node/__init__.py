"""One node's round, above the three ports.

:mod:`.spec` (what a node is asked to be: :class:`~sapo_async.node.spec.NodeSpec`),
:mod:`.groups` (generate, wire and score groups: pure pieces), :mod:`.learner` (tasks,
generator, verifier and trainer for one model), :mod:`.sampler` (the pure I/J selection),
:mod:`.admission` (the node's admission checks and :func:`~.admission.build_collector`),
:mod:`.selection` and :mod:`.view` (one view of each external candidate, screened in a
worker thread), :mod:`.defence`, :mod:`.plausibility` and :mod:`.filters` (what a node
refuses from peers), :mod:`.rounds` (the round: generate, publish, collect, sample, train,
commit),
:mod:`.lifecycle` (the node's life cycle as an actor), :mod:`.checkpoint`, :mod:`.report` (what
a round reports), :mod:`.embedded` (the process's shared NATS server and EVM),
:mod:`.swarm` (assembling a node from a spec) and :mod:`.runner` (running a swarm of this
process's nodes: their logs, their landed commitments).
Imports the fabric, the ledger and the policy; none of them imports it.
"""
