"""The attack experiment: a local swarm where some nodes attack, defences off and on.

``base`` (the attack protocol and the attacker's publisher), one module per attack
(``inject``, ``tokens``, ``length``, ``flood``, ``absurd``, ``wrong``, ``filler``),
``spec`` (what a matrix runs: its sizes and a node's own ``DefenceSpec``), ``runner`` (the
lockstep harness and the matrix), ``origin`` (whose a producer is), ``record`` (the
resumable ``runs.jsonl``, older records read in today's terms), and the summary and figure
(``summary`` and the modules it draws on). See docs/security.md.
"""
