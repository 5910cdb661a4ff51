"""Print the broker permissions of one volunteer of a swarm, with its consumers bound to it.

NATS subjects have no partial-token wildcards and static server configs no per-user
templates, so a volunteer's own consumers are fenced by name: the operator gives each
volunteer credential an *owner* token, the volunteer sets the same ``[nats] consumer_owner``,
and its node names its consumers ``<owner>-0`` .. ``<owner>-5``
(``sapo_async.limits.CONSUMER_SLOTS``). The block printed here allows exactly those names for
creating, inspecting, fetching from and acking consumers, so no volunteer can fetch from or
ack on another's consumer (nor take its name over by creating it).

    python infra/nats/gen_permissions.py alice                 # swarm `main`
    python infra/nats/gen_permissions.py alice --swarm other

Paste the block into ``accounts.conf`` and give the user ``permissions: $<NAME>``.
``tests/integration/test_nats_permissions.py`` checks that the committed blocks are what this
script prints.
"""

from __future__ import annotations

import argparse

from sapo_async.fabric.transport.jetstream_admin import owned_consumer_names, stream_name


def variable_name(swarm: str, owner: str) -> str:
    """The config variable holding ``owner``'s permissions in ``swarm``."""
    return f"VOLUNTEER_{swarm}_{owner}".upper().replace("-", "_")


def permissions_block(swarm: str, owner: str) -> str:
    """The ``accounts.conf`` variable of one volunteer of ``swarm`` bound to ``owner``."""
    stream = stream_name(swarm)
    lines = [
        f"# A volunteer of swarm `{swarm}` whose consumers are bound to owner `{owner}`",
        "# (generated: python infra/nats/gen_permissions.py "
        + (owner if swarm == "main" else f"{owner} --swarm {swarm}")
        + ").",
        f"{variable_name(swarm, owner)} = {{",
        "  publish = {",
        "    allow = [",
        "      # its rollouts, and the account's and the stream's state",
        f'      "sapo.{swarm}.rollouts.>"',
        '      "$JS.API.INFO"',
        f'      "$JS.API.STREAM.INFO.{stream}"',
        "      # its own consumers only: create (nats-py's two forms, and durable), inspect,",
        "      # fetch from, ack",
    ]
    for name in owned_consumer_names(owner):
        lines += [
            f'      "$JS.API.CONSUMER.CREATE.{stream}.{name}"',
            f'      "$JS.API.CONSUMER.CREATE.{stream}.{name}.>"',
            f'      "$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}"',
            f'      "$JS.API.CONSUMER.INFO.{stream}.{name}"',
            f'      "$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}"',
            f'      "$JS.ACK.{stream}.{name}.>"',
        ]
    lines += [
        "    ]",
        "  }",
        "  # replies to its requests and the messages it fetches arrive on its inboxes",
        '  subscribe = { allow = ["_INBOX.>"] }',
        "}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("owner", nargs="+", help="owner token(s): letters, digits, - and _")
    parser.add_argument("--swarm", default="main", help="the swarm (default: main)")
    args = parser.parse_args()
    print("\n".join(permissions_block(args.swarm, owner) for owner in args.owner), end="")


if __name__ == "__main__":
    main()
