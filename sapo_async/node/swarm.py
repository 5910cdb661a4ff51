"""Joining a swarm: builds a running :class:`~sapo_async.node.lifecycle.Node` from a
:class:`~sapo_async.node.spec.NodeSpec`.

Owns wiring, not behaviour: which model, tasks, transport and ledger a node gets, resuming
from its last checkpoint, and handing the node what it must close when it leaves. Without a
NATS URL or an RPC URL the node shares the process's embedded services
(:mod:`.embedded`).

Usage::

    async with Swarm.join(swarm="demo", local=4, external=4) as node:
        async for report in node.rounds():
            print(report.round, report.reward_mean)

or ``node = await Swarm.join(spec)`` ... ``await node.leave()`` from the same task.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Generator
from contextlib import AbstractContextManager, AsyncExitStack
from pathlib import Path
from typing import Any, TypeVar

import anyio
from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async.backoff import NATS_JOIN_BACKOFF, retry_async
from sapo_async.errors import ConfigError, TransportUnavailable
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.base import StartAt, Transport
from sapo_async.ledger.journal import Journal
from sapo_async.ledger.recorder import Recorder
from sapo_async.lockfile import hold_dir, hold_key
from sapo_async.logs import get_logger
from sapo_async.node.admission import NodeDefences, build_collector
from sapo_async.node.checkpoint import has_checkpoint
from sapo_async.node.commitments import CARRIED, journal_carried
from sapo_async.node.embedded import EMBEDDED
from sapo_async.node.learner import Learner, build_learner
from sapo_async.node.lifecycle import Node, default_name
from sapo_async.node.rounds import RoundLoop
from sapo_async.node.spec import MAX_NODE_INDEX, FabricSpec, NodeSpec

__all__ = ["NodeParts", "Swarm", "assemble", "complete_spec", "node_index_for", "node_locks"]

_log = get_logger("swarm")

_T = TypeVar("_T")


def node_index_for(address: str) -> int:
    """A node's slot in the task index layout, derived from its address.

    Addresses are uniformly distributed, so two of 100 nodes share a slot with probability
    about 0.5 %; a collision only means two nodes may draw the same questions.
    """
    digest = hashlib.sha256(address.lower().encode()).digest()
    return int.from_bytes(digest[:8], "big") % MAX_NODE_INDEX


class _Join:
    """What :meth:`Swarm.join` returns: await it, or use it as an async context manager."""

    def __init__(self, spec: NodeSpec) -> None:
        self._spec = spec
        self._node: Node | None = None

    def __await__(self) -> Generator[Any, None, Node]:
        return Swarm.start(self._spec).__await__()

    async def __aenter__(self) -> Node:
        self._node = await Swarm.start(self._spec)
        return self._node

    async def __aexit__(self, *exc_info: object) -> None:
        if self._node is not None:
            await self._node.leave()


class Swarm:
    """Entry point of the Python API (see the module docstring)."""

    @staticmethod
    def join(spec: NodeSpec | None = None, /, **settings: Any) -> _Join:
        """Build a node, connect it and start its round loop.

        Args:
            spec: what the node is (:class:`~sapo_async.node.spec.NodeSpec`, every setting
                documented there); None: the defaults.
            **settings: flat settings on top of ``spec``, as :meth:`NodeSpec.build` takes
                them (``local=2``, ``questions_per_round=4``, ``ledger_enabled=False``).

        Returns:
            An awaitable that is also an async context manager, giving a running
            :class:`~sapo_async.node.lifecycle.Node`.

        Raises:
            ConfigError: an unknown setting or an invalid value (named), at once.
        """
        spec = spec or NodeSpec()
        return _Join(spec.replace(**settings) if settings else spec)

    @staticmethod
    async def start(spec: NodeSpec) -> Node:
        """Build and start a node as ``spec`` asks (what awaiting :meth:`join` does).

        Must be paired with :meth:`Node.leave` in the same task.

        Raises:
            ConfigError: an invalid setting.
            TransportUnavailable: NATS stayed unreachable for ``fabric.connect_timeout_s``.
        """
        spec = complete_spec(spec)
        stack = AsyncExitStack()
        try:
            for lock in node_locks(spec):  # released last, when the node has stopped
                stack.enter_context(lock)
            parts = await assemble(spec, stack)
            node = Node(parts.round_loop(offload=True))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
            raise
        # The node closes the stack when it stops, after its own actors (also when its
        # start fails), last in first out: journal, ledger, transport, embedded server.
        node.add_cleanup(stack)
        await node.start()
        return node


def node_locks(spec: NodeSpec) -> list[AbstractContextManager[Path]]:
    """The OS locks a started node holds while it runs (:mod:`sapo_async.lockfile`): its
    checkpoint directory, and its key on an RPC ledger (two nodes with one key would commit
    conflicting rounds for one address). Taken by :meth:`Swarm.start` before anything
    loads, so a second node on either is refused at once; the embedded ledger lives in one
    process and needs no key lock.

    Args:
        spec: a completed spec (:func:`complete_spec`).
    """
    locks: list[AbstractContextManager[Path]] = []
    if spec.checkpoint.dir is not None:
        locks.append(
            hold_dir(
                Path(spec.checkpoint.dir),
                what="checkpoint directory",
                field="checkpoint.dir",
                advice="run one node per checkpoint directory: stop that node, or give this "
                "one its own checkpoint.dir",
            )
        )
    ledger = spec.ledger
    if ledger.enabled and ledger.rpc_url is not None and spec.account is not None:
        chain = f"chain {ledger.chain_id}" if ledger.chain_id is not None else ledger.rpc_url
        locks.append(
            hold_key(
                spec.account.address,
                ledger=f"{str(ledger.contract_address).lower()} on {chain}",
                shown=str(ledger.contract_address),
            )
        )
    return locks


PublisherFactory = Callable[[Transport, LocalAccount], Publisher]
"""Builds a node's publisher from its transport and key (an experiment's attacker swaps it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeParts:
    """A node's pieces, as :func:`assemble` builds them from its (completed) spec."""

    spec: NodeSpec
    learner: Learner
    transport: Transport
    publisher: Publisher
    collector: Collector
    recorder: Recorder | None
    defences: NodeDefences

    def round_loop(self, *, offload: bool) -> RoundLoop:
        """The node's round loop over these parts (``offload``: worker threads)."""
        return RoundLoop(
            self.spec,
            name=str(self.spec.name),
            learner=self.learner,
            publisher=self.publisher,
            collector=self.collector,
            recorder=self.recorder,
            defences=self.defences,
            offload=offload,
        )


def complete_spec(spec: NodeSpec) -> NodeSpec:
    """``spec`` with its key (a new one if none), name and task slot filled in."""
    account: LocalAccount = spec.account or Account.create()
    index = spec.node_index
    return spec.replace(
        account=account,
        name=spec.name or default_name(account.address),
        node_index=node_index_for(account.address) if index is None else index,
    )


async def assemble(
    spec: NodeSpec,
    stack: AsyncExitStack,
    *,
    learner: Learner | None = None,
    publisher: PublisherFactory = Publisher,
    offload: bool = True,
) -> NodeParts:
    """Build a node's pieces from ``spec``: the one way a node is assembled.

    :meth:`Swarm.start`, the experiments' lockstep harness
    (:mod:`sapo_async.experiment.lockstep`) and the lone node of ``sapo-async train``
    (:mod:`.alone`) all come here. The transport is ``spec.fabric.transport`` when given (the
    in-memory broker), else NATS; the recorder is None without a ledger.

    Args:
        spec: a completed spec (:func:`complete_spec`).
        stack: what must close when the node leaves is pushed onto it (the caller closes
            it, last in first out, once the node's pieces stopped).
        learner: a learner built already (default: :func:`build_learner` from ``spec``).
        publisher: builds the publisher (default :class:`Publisher`).
        offload: the learner's generation runs in a worker thread.

    Raises:
        ConfigError: an invalid setting.
        TransportUnavailable: NATS stayed unreachable for ``fabric.connect_timeout_s``.
    """
    account = spec.account
    if account is None or spec.name is None:
        raise ConfigError("assemble() takes a completed spec (complete_spec)", field="account")
    carried: list[str] = []  # commitments the resumed checkpoint carried (.commitments)
    if learner is None:
        learner = await anyio.to_thread.run_sync(lambda: build_learner(spec, offload=offload))
        carried = await _prepare_learner(spec, learner, account.address)
    transport = spec.fabric.transport or await _connect(spec, stack)
    # The one place a node's collector is built: its whole admission pipeline, with the
    # defences the round loop shares (quarantine, calibration).
    defences = NodeDefences.build(spec, learner.tasks.families)
    collector = build_collector(
        spec,
        transport,
        defences,
        own_address=account.address,
        families=sorted({f.family for f in learner.tasks.families}) or None,
        start=_start_at(spec.fabric),
    )
    recorder = await _make_recorder(spec, account, learner, stack, carried)
    return NodeParts(
        spec, learner, transport, publisher(transport, account), collector, recorder, defences
    )


async def _prepare_learner(spec: NodeSpec, learner: Learner, address: str) -> list[str]:
    """Swap in the vLLM engine if asked, and resume from the latest checkpoint; returns the
    commitments that checkpoint carried (JSON bodies, for :func:`journal_carried`)."""
    policy = spec.policy
    if policy.backend == "vllm":
        from sapo_async.policy.generation.vllm_api import VllmSettings
        from sapo_async.policy.generation.vllm_backend import VllmGenerator

        engine = await VllmGenerator.create(
            VllmSettings(
                model=str(policy.model),
                gpu_memory_utilization=policy.gpu_memory_utilization,
                seed=spec.training.seed,
                sleep_level=1 if policy.sleep_mode else 0,
            ),
            trainer_model=learner.model,
        )
        await engine.probe()  # engine and trainer must start from the same weights
        learner.generator = engine
    directory = spec.checkpoint.dir
    if directory is not None and await anyio.to_thread.run_sync(has_checkpoint, Path(directory)):
        state = await anyio.to_thread.run_sync(learner.restore, Path(directory))
        # A generator with its own copy of the weights (overlap, bf16 generation, vLLM)
        # was built before the restore: give it the restored ones (a no-op when shared).
        await learner.generator.sync_weights(learner.model.named_parameters())
        for damaged in state.damaged:
            _log.warning(
                "checkpoint_damaged",
                node=address,
                path=str(damaged.path),
                reason=damaged.reason,
                kept_as=str(damaged.kept_as),
                resumed_from=str(state.path),
                advice="nothing was deleted: inspect or delete the damaged copy",
            )
        _log.info(
            "node_resumed",
            node=address,
            round=learner.round,
            policy_version=learner.policy_version,
            checkpoint=str(state.path),
        )
        carried = state.extra.get(CARRIED, [])
        return [str(body) for body in carried] if isinstance(carried, list) else []
    return []


def _start_at(fabric: FabricSpec) -> StartAt:
    if fabric.start == "new":
        return StartAt.new()
    if fabric.start == "all":
        return StartAt.everything()
    return StartAt.last(float(fabric.start))


async def _connect(spec: NodeSpec, stack: AsyncExitStack) -> Transport:
    """Connect to NATS JetStream (starting or sharing the embedded server without a URL)."""
    from sapo_async.fabric.transport.jetstream import JetStreamTransport, StreamSettings

    fabric = spec.fabric
    url = ",".join(fabric.urls) or None
    if url is None:
        url = await EMBEDDED.acquire_nats()
        stack.push_async_callback(EMBEDDED.release_nats)
    options = fabric.options(url, name=f"sapo-{spec.name}")
    transport = await _connect_with_backoff(
        lambda: JetStreamTransport.connect(
            options, spec.swarm, settings=StreamSettings(replicas=fabric.stream_replicas)
        ),
        what=f"NATS JetStream at {_redact(url)}",
        timeout_s=fabric.connect_timeout_s,
    )
    stack.push_async_callback(transport.aclose)
    return transport


def _redact(url: str) -> str:
    """A URL list without credentials, for logs."""
    return ",".join(part.rsplit("@", 1)[-1] for part in url.split(","))


async def _connect_with_backoff(
    connect: Callable[[], Awaitable[_T]], *, what: str, timeout_s: float
) -> _T:
    """Call ``connect()`` until it succeeds, backing off as :data:`NATS_JOIN_BACKOFF` says.

    Raises:
        TransportUnavailable: still unreachable after ``timeout_s``.
    """

    def retried(attempt: int, exc: Exception, delay: float) -> None:
        _log.warning("waiting_for_nats", target=what, retry_in_s=delay, error=str(exc))

    try:
        return await retry_async(
            connect,
            retry_on=(TransportUnavailable,),
            schedule=NATS_JOIN_BACKOFF,
            timeout_s=timeout_s,
            on_retry=retried,
        )
    except TransportUnavailable as exc:
        raise TransportUnavailable(
            f"{what} still unreachable after {timeout_s:.0f} s: {exc}"
        ) from exc


async def _make_recorder(
    spec: NodeSpec,
    account: LocalAccount,
    learner: Learner,
    stack: AsyncExitStack,
    carried: list[str],
) -> Recorder | None:
    """The node's recorder and journal (None without a ledger).

    The commitments the resumed checkpoint carried (``carried``) that the journal lacks are
    journaled first (:mod:`.commitments`: a node stopped between a checkpoint and its
    journal write loses none). A node never reuses a round already journaled: rounds
    strictly increase on chain, so the learner's round moves past the journal's last.
    """
    from sapo_async.ledger.connect import connect_ledger

    ledger_spec = spec.ledger
    if not ledger_spec.enabled:
        return None
    if ledger_spec.rpc_url is None:
        handle = await EMBEDDED.acquire_ledger(spec.swarm)
        stack.push_async_callback(EMBEDDED.release_ledger, spec.swarm)
        ledger = handle.ledger
        path = ledger_spec.journal_path or handle.journal_dir / f"{account.address}.sqlite"
    else:
        # NodeSpec checked that an RPC URL comes with a contract and a journal path.
        ledger = connect_ledger(
            ledger_spec.rpc_url,
            str(ledger_spec.contract_address),
            relayer_key=ledger_spec.relayer_private_key(),
        )
        path = Path(str(ledger_spec.journal_path))
    journal = Journal(path)
    stack.callback(journal.close)
    await journal_carried(journal, account.address, carried, _log)
    journaled = [e.round for e in journal.entries(account.address)]
    after_journal = max(journaled, default=-1) + 1
    if after_journal > learner.round:
        # Only when the checkpoint is older than the journal (a node that checkpoints
        # before each commitment, as the round loop does, is never here after a crash).
        _log.warning(
            "resumed_behind_journal",
            node=account.address,
            checkpoint_round=learner.round,
            journal_round=after_journal,
            skipped_rounds=after_journal - learner.round,
        )
        learner.set_round(after_journal)
    return Recorder(ledger, journal, account, metadata=learner.model_id)
