"""The attack experiment: a local swarm where some nodes attack, defences off and on.

``base`` (the attack protocol and the attacker's publisher), one module per attack
(``inject``, ``tokens``, ``length``, ``flood``, ``absurd``, ``wrong``, ``filler``) and
``runner`` (the lockstep harness, the matrix, the summary and the figure). See
docs/security.md.
"""
