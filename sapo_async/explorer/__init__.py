"""The contribution explorer: a local web app over a swarm's ledger and its nodes' logs.

Modules, bottom up:

- :mod:`.views`: pure functions that turn audits, chain events and JSONL round logs into
  the JSON the pages show (no web framework, no chain);
- :mod:`.source`: :class:`~.source.Explorer`, which reads the ledger (through the audit
  views of :mod:`sapo_async.ledger.audit`), the logs and the journals, and caches a snapshot;
- :mod:`.app`: the Starlette app: the pages, the JSON API under ``/api/`` and the live
  stream (server-sent events);
- :mod:`.server`: serving the app with uvicorn inside a running event loop;
- :mod:`.demo`: a short embedded swarm for ``sapo-async explorer --demo``.

Starlette and uvicorn are an optional extra (``pip install sapo_async[explorer]``); only
:mod:`.app` and :mod:`.server` import them, and the command line imports this package
inside its command, so ``sapo-async --help`` never pays for them.
"""
