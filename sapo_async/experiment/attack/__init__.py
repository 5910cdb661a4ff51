"""The attack experiment: a local swarm where some nodes attack, defences off and on.

``base`` (the attack protocol and the attacker's publisher), one module per attack
(``inject``, ``tokens``, ``length``, ``flood``, ``absurd``, ``wrong``, ``filler``; from the
literature and live networks, issue 57: ``trigger``, ``stock_leads``, ``longest``,
``capped``, ``post_selected``, ``sybil``, and the held-out ``trigger_nonsense``,
``false_step``, ``sleeper``, ``diluted``, built from the attacker's own work by
``genuine``),
``spec`` (what a matrix runs: its sizes and a node's own ``DefenceSpec``), ``runner`` (the
lockstep harness and the matrix), ``origin`` (whose a producer is), ``record`` (the
resumable ``runs.jsonl``, older records read in today's terms), and the summary and figure
(``summary`` and the modules it draws on). See docs/security.md.
"""
