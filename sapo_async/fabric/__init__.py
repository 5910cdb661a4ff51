"""The fabric: rollouts in and out of the swarm.

:mod:`.transport` is the port (a ``base`` protocol, the in-memory broker, JetStream and the
embedded nats-server); :mod:`.publisher` signs and publishes a node's groups;
:mod:`.collector` admits other nodes' groups (verify, de-duplicate, bound, buffer) and
rejects everything else by reason. Imports only the foundation and :mod:`sapo_async.wire`;
knows nothing of models, the ledger or the round.
"""
