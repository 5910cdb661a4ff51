"""``python -m sapo_async`` is the ``sapo-async`` command."""

from sapo_async.cli.main import main

if __name__ == "__main__":
    main()
