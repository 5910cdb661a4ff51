"""The policy: the model a node trains and everything that touches its weights.

:mod:`.models` (loading any causal LM; the tiny offline model), :mod:`.generation` (the
generator port: transformers, vLLM, a scripted fake) and :mod:`.grpo` (the pure GRPO maths
and the torch trainer), which import one way: ``models -> generation`` (the tiny-model
builder samples to measure its warm start), and all three use :mod:`.digest`. Imports the
foundation, :mod:`sapo_async.wire` and :mod:`sapo_async.tasks`; knows nothing of NATS or
the chain.
"""
