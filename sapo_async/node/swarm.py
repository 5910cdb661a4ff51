"""Joining a swarm: builds a :class:`~sapo_async.node.loop.Node` from plain settings.

Owns wiring, not behaviour: which model, tasks, transport and ledger a node gets, and the
process-wide embedded services. With no NATS URL the first node of a process starts a
private ``nats-server`` (JetStream, free loopback port, temporary store) and every later
node of that process shares it; with no RPC URL the first node starts an in-process EVM and
deploys the swarm's ledger contract, shared the same way. The last node to leave stops them.

Usage::

    async with Swarm.join(swarm="demo", local=4, external=4) as node:
        async for report in node.rounds():
            print(report.round, report.reward_mean)

or ``node = await Swarm.join(...)`` ... ``await node.leave()`` from the same task.
"""

from __future__ import annotations

import copy
import hashlib
import tempfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import anyio
from eth_account import Account
from eth_account.signers.local import LocalAccount

from sapo_async.errors import ConfigError, TransportUnavailable
from sapo_async.fabric.collector import Collector
from sapo_async.fabric.publisher import Publisher
from sapo_async.fabric.transport.base import StartAt, Transport
from sapo_async.limits import ACTOR_DRAIN_TIMEOUT_S, NATS_JOIN_TIMEOUT_S
from sapo_async.logs import get_logger
from sapo_async.node.learner import LocalTrainerNode, NodeConfig
from sapo_async.node.loop import Node
from sapo_async.node.sampler import SamplerPolicy
from sapo_async.policy.grpo.trainer import TrainerConfig
from sapo_async.tasks import TaskSource
from sapo_async.tasks.spec import FamilySpec, preset
from sapo_async.wire import SamplingParams

__all__ = ["LedgerHandle", "Swarm", "build_learner", "node_index_for"]

_log = get_logger("swarm")

TASK_INDEX_NODES = 1 << 20
"""Node slots in the task index layout (sapo_async.tasks.source.MAX_NODES)."""


def node_index_for(address: str) -> int:
    """A node's slot in the task index layout, derived from its address.

    Addresses are uniformly distributed, so two of 100 nodes share a slot with probability
    about 0.5 %; a collision only means two nodes may draw the same questions.
    """
    return int.from_bytes(hashlib.sha256(address.lower().encode()).digest()[:8], "big") % (
        TASK_INDEX_NODES
    )


def build_learner(
    *,
    model: str | Any = "tiny",
    regime: Literal["sparse", "dense"] = "sparse",
    tasks: str | tuple[FamilySpec, ...] = "cpu",
    seed: int = 0,
    node_index: int = 0,
    questions: int = 8,
    completions: int = 8,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    trainer: TrainerConfig | None = None,
    device: str = "cpu",
    offload: bool = False,
    prompt_style: Literal["auto", "compact", "instruct"] = "auto",
    overlap: bool = False,
) -> LocalTrainerNode:
    """Build one node's learner: model, tasks, generator, verifier and GRPO trainer.

    Args:
        model: ``"tiny"`` (the project's offline model of ``regime``), a local directory, a
            hub id, or an already loaded :class:`~sapo_async.policy.models.LoadedModel`.
        regime: the tiny model's warm start (``"sparse"`` or ``"dense"``).
        tasks: a preset name (``"cpu"``, ``"paper"``) or family specs.
        seed: the swarm seed (shared by all nodes: common random numbers).
        node_index: this node's slot in the task index layout.
        questions / completions: B and L.
        max_new_tokens / temperature / top_p: sampling.
        trainer: GRPO settings.
        device: ``"cpu"`` or ``"cuda"``.
        offload: run generation in a worker thread.
        prompt_style: ``compact`` (bare expression, for models trained from scratch),
            ``instruct`` (question plus answer-format instruction, for real LMs), or
            ``auto`` (compact for the tiny model, instruct otherwise).
        overlap: give the generator its own copy of the weights (synced after each step),
            so the next round can be generated while this one trains.

    Raises:
        ConfigError: an invalid setting (named).
    """
    import transformers

    from sapo_async.policy.generation.transformers_backend import TransformersGenerator
    from sapo_async.policy.models import LoadedModel, load_model, load_tiny_model, tiny_spec

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call] # one bar per node clutters the display

    if isinstance(model, LoadedModel):
        loaded = model
    elif model in ("tiny", "auto"):
        loaded = load_tiny_model(tiny_spec(regime), device=device)
    else:
        loaded = load_model(str(model), device=device)
    families = preset(tasks) if isinstance(tasks, str) else tuple(tasks)
    is_tiny = loaded.model_id.startswith("sapo-tiny")
    style = prompt_style if prompt_style != "auto" else ("compact" if is_tiny else "instruct")
    config = NodeConfig(
        swarm_seed=seed,
        node_index=node_index,
        batch=questions,
        group_size=completions,
        sampling=SamplingParams(
            temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens
        ),
        prompt_style=style,
        chat_template=style == "instruct"
        and getattr(loaded.tokenizer, "chat_template", None) is not None,
        trainer=trainer or TrainerConfig(),
    )
    generator = TransformersGenerator(
        copy.deepcopy(loaded.model) if overlap else loaded.model,
        loaded.tokenizer,
        model_id=loaded.model_id,
        add_special_tokens=not config.chat_template,
        shares_trainer_module=not overlap,
        offload_to_thread=offload,
    )
    return LocalTrainerNode(
        loaded.model,
        loaded.tokenizer,
        TaskSource(families, swarm_seed=seed),
        config,
        model_id=loaded.model_id,
        generator=generator,
    )


@dataclass
class LedgerHandle:
    """A swarm's ledger as the nodes of this process share it.

    Attributes:
        ledger: the contract client (an :class:`~sapo_async.ledger.EvmLedger`).
        journal_dir: where node journals live.
    """

    ledger: Any
    journal_dir: Path


class _Embedded:
    """Process-wide embedded services, shared by the nodes of this process (refcounted)."""

    def __init__(self) -> None:
        self.nats: Any = None
        self.nats_users = 0
        self.ledgers: dict[str, LedgerHandle] = {}
        self.ledger_users: dict[str, int] = {}
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self.lock = anyio.Lock()

    async def acquire_nats(self) -> str:
        from sapo_async.fabric.transport.embedded import EmbeddedNats

        async with self.lock:
            if self.nats is None:
                server = EmbeddedNats()
                await server.start()
                self.nats = server
                _log.info("embedded_nats_started", url=server.url)
            self.nats_users += 1
            return str(self.nats.url)

    async def release_nats(self) -> None:
        async with self.lock:
            self.nats_users -= 1
            if self.nats_users == 0 and self.nats is not None:
                server, self.nats = self.nats, None
                with anyio.CancelScope(shield=True):
                    await server.aclose()

    async def acquire_ledger(self, swarm: str) -> LedgerHandle:
        from sapo_async.ledger.connect import open_embedded_ledger

        async with self.lock:
            if swarm not in self.ledgers:
                ledger = await open_embedded_ledger(swarm)
                if self.tmp is None:
                    self.tmp = tempfile.TemporaryDirectory(prefix="sapo-journal-")
                self.ledgers[swarm] = LedgerHandle(ledger, Path(self.tmp.name) / swarm)
                _log.info("embedded_ledger_deployed", swarm=swarm, address=ledger.address)
            self.ledger_users[swarm] = self.ledger_users.get(swarm, 0) + 1
            return self.ledgers[swarm]

    async def release_ledger(self, swarm: str) -> None:
        async with self.lock:
            self.ledger_users[swarm] -= 1
            if self.ledger_users[swarm] == 0:
                del self.ledgers[swarm]
                del self.ledger_users[swarm]
                if not self.ledgers and self.tmp is not None:
                    self.tmp.cleanup()
                    self.tmp = None


_EMBEDDED = _Embedded()


def embedded_ledger(swarm: str) -> LedgerHandle | None:
    """The embedded ledger of ``swarm`` in this process, if a node holds one (audits)."""
    return _EMBEDDED.ledgers.get(swarm)


class _Join:
    """What :meth:`Swarm.join` returns: await it, or use it as an async context manager."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self._kwargs = kwargs
        self._node: Node | None = None

    def __await__(self) -> Generator[Any, None, Node]:
        return Swarm._join(**self._kwargs).__await__()

    async def __aenter__(self) -> Node:
        self._node = await Swarm._join(**self._kwargs)
        return self._node

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._node is not None:
            await self._node.leave()


class Swarm:
    """Entry point of the Python API (see the module docstring)."""

    @staticmethod
    def join(
        *,
        swarm: str = "local",
        model: str | Any = "tiny",
        tasks: str | tuple[FamilySpec, ...] = "cpu",
        regime: Literal["sparse", "dense"] = "sparse",
        local: int = 4,
        external: int = 4,
        questions: int = 8,
        completions: int = 8,
        nats_url: str | None = None,
        nats_options: Any = None,
        stream_replicas: int = 1,
        connect_timeout_s: float = NATS_JOIN_TIMEOUT_S,
        transport: Transport | None = None,
        ledger: bool | str = True,
        contract_address: str | None = None,
        relayer_key: str | None = None,
        account: LocalAccount | None = None,
        name: str | None = None,
        node_index: int | None = None,
        seed: int = 0,
        rounds: int | None = None,
        sampler: SamplerPolicy = "paper",
        per_producer_cap: int | None = None,
        max_staleness_rounds: int = 4,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        trainer: TrainerConfig | None = None,
        start: Literal["new", "all"] | float = "all",
        include_tokens: bool = True,
        device: str = "cpu",
        backend: Literal["transformers", "vllm"] = "transformers",
        gpu_memory_utilization: float = 0.3,
        prompt_style: Literal["auto", "compact", "instruct"] = "auto",
        overlap: bool = False,
        sleep_mode: bool = False,
        limiter: anyio.CapacityLimiter | None = None,
        journal_path: Path | None = None,
        extra_check: Any = None,
        checkpoint_dir: Path | None = None,
        checkpoint_every: int = 10,
        drain_timeout_s: float = ACTOR_DRAIN_TIMEOUT_S,
    ) -> _Join:
        """Build a node, connect it and start its round loop.

        Args:
            swarm: the swarm's name (stream, subjects and ledger are per swarm).
            model: ``"tiny"``, a local model directory, a hub id or a loaded model.
            tasks: a task preset name (``"cpu"``, ``"paper"``) or family specs.
            regime: the tiny model's warm start, ``"sparse"`` or ``"dense"``.
            local / external: I and J, groups trained on per round.
            questions / completions: B and L, generated per round.
            nats_url: NATS server(s); None starts (or shares) an embedded server.
            nats_options: a :class:`~sapo_async.fabric.transport.NatsOptions` (credentials, TLS).
            connect_timeout_s: how long to keep retrying NATS (with backoff, saying what it
                waits for) before giving up.
            stream_replicas: replicas of the swarm's stream (3 on a three-server cluster,
                so losing one server loses no acknowledged group).
            transport: use this transport instead (tests, the in-memory broker).
            ledger: True for the embedded EVM, an ``http(s)://`` RPC URL, or False for none.
            contract_address: the ledger contract on an RPC chain.
            relayer_key: key of an account that pays for this node's commitments (EIP-712
                relaying); None: the node pays its own gas.
            account: the node's key (a fresh one if None).
            name: a human name.
            node_index: slot in the task index layout (derived from the address if None).
            seed: the swarm seed (common random numbers).
            rounds: stop after this many rounds (None: until left).
            sampler / per_producer_cap / max_staleness_rounds: external sampling.
            max_new_tokens / temperature / top_p: sampling.
            trainer: GRPO settings.
            start: where this node's consumer starts: ``"new"`` messages only, ``"all"``
                retained ones, or a number of seconds back.
            include_tokens: share token ids and log-probs.
            device: ``"cpu"`` or ``"cuda"``.
            backend: ``"transformers"`` (CPU or CUDA, shares the trainer's module) or
                ``"vllm"`` (a colocated engine on the GPU, weights pushed in memory and
                checked by a log-prob probe after every step; needs the ``gpu`` extra).
            gpu_memory_utilization: the vLLM engine's share of GPU memory.
            prompt_style: how questions are shown to the model (see :func:`build_learner`).
            overlap: generate round r+1 while round r trains (see
                :class:`~sapo_async.node.loop.Node`).
            sleep_mode: put the vLLM engine to sleep (level 1) around each training step.
            limiter: worker-thread limiter shared by the nodes of a process.
            journal_path: the ledger journal's SQLite file.
            extra_check: a receiver-side check added to the collector's.
            checkpoint_dir: checkpoints go here, and the node resumes from the latest one
                (model, optimizer, round, RNG states).
            checkpoint_every: rounds between checkpoints (one is also saved on leave).
            drain_timeout_s: how long leaving lets the round in progress finish.

        Returns:
            An awaitable that is also an async context manager, giving a running
            :class:`~sapo_async.node.loop.Node`.

        Raises:
            ConfigError: an invalid setting (named).
        """
        return _Join(dict(locals()))

    @staticmethod
    async def _join(**kw: Any) -> Node:
        from sapo_async.fabric.transport.embedded import NatsOptions
        from sapo_async.fabric.transport.jetstream import JetStreamTransport, StreamSettings

        if kw["local"] < 0 or kw["external"] < 0 or kw["local"] + kw["external"] == 0:
            raise ConfigError(
                "local and external must be >= 0 and not both 0, "
                f"got {kw['local']}/{kw['external']}",
                field="training.local",
            )
        if kw["local"] > kw["questions"]:
            raise ConfigError(
                f"local ({kw['local']}) cannot exceed questions per round ({kw['questions']})",
                field="training.local",
            )
        account: LocalAccount = kw["account"] or Account.create()
        swarm: str = kw["swarm"]
        name = kw["name"] or f"node-{account.address[2:8].lower()}"
        index = (
            kw["node_index"] if kw["node_index"] is not None else node_index_for(account.address)
        )
        learner = await anyio.to_thread.run_sync(
            lambda: build_learner(
                model=kw["model"],
                regime=kw["regime"],
                tasks=kw["tasks"],
                seed=kw["seed"],
                node_index=index,
                questions=kw["questions"],
                completions=kw["completions"],
                max_new_tokens=kw["max_new_tokens"],
                temperature=kw["temperature"],
                top_p=kw["top_p"],
                trainer=kw["trainer"],
                device=kw["device"],
                offload=True,
                prompt_style=kw["prompt_style"],
                overlap=kw["overlap"],
            )
        )
        if kw["backend"] == "vllm":
            from sapo_async.policy.generation.vllm_api import VllmSettings
            from sapo_async.policy.generation.vllm_backend import VllmGenerator

            engine = await VllmGenerator.create(
                VllmSettings(
                    model=str(kw["model"]),
                    gpu_memory_utilization=kw["gpu_memory_utilization"],
                    seed=kw["seed"],
                    sleep_level=1 if kw["sleep_mode"] else 0,
                ),
                trainer_model=learner.model,
            )
            await engine.probe()  # engine and trainer must start from the same weights
            learner.generator = engine
        checkpoint_dir: Path | None = kw["checkpoint_dir"]
        if checkpoint_dir is not None and (Path(checkpoint_dir) / "LATEST").is_file():
            await anyio.to_thread.run_sync(learner.restore, Path(checkpoint_dir))
            _log.info(
                "node_resumed",
                node=account.address,
                round=learner.round,
                policy_version=learner.policy_version,
            )
        cleanups: list[Any] = []
        transport: Transport | None = kw["transport"]
        try:
            if transport is None:
                options = kw["nats_options"] or NatsOptions()
                url = kw["nats_url"] or options.url
                if url is None:
                    url = await _EMBEDDED.acquire_nats()
                    cleanups.append(_EMBEDDED.release_nats)
                from dataclasses import replace

                options = replace(options, url=url, name=f"sapo-{name}")
                transport = await _connect_with_backoff(
                    lambda: JetStreamTransport.connect(
                        options, swarm, settings=StreamSettings(replicas=kw["stream_replicas"])
                    ),
                    what=f"NATS JetStream at {_redact(str(options.url))}",
                    timeout_s=kw["connect_timeout_s"],
                )
                cleanups.append(transport.aclose)
            start = kw["start"]
            start_at = (
                StartAt.new()
                if start == "new"
                else StartAt.everything()
                if start == "all"
                else StartAt.last(float(start))
            )
            collector = Collector(
                transport,
                own_address=account.address,
                families=sorted({f.family for f in learner.tasks.families}) or None,
                start=start_at,
                extra_check=kw["extra_check"],
                name=f"collector-{name}",
            )
            recorder = None
            ledger_opt = kw["ledger"]
            if ledger_opt:
                recorder, journal = await _make_recorder(
                    ledger_opt,
                    contract_address=kw["contract_address"],
                    relayer_key=kw["relayer_key"],
                    swarm=swarm,
                    account=account,
                    learner=learner,
                    journal_path=kw["journal_path"],
                    cleanups=cleanups,
                )
                # Never reuse a round already journaled (e.g. after a crash between a
                # commitment and the next checkpoint): rounds strictly increase on chain.
                journaled = [e.round for e in journal.entries(account.address)]
                learner.round = max(learner.round, max(journaled, default=-1) + 1)
            node = Node(
                name=name,
                learner=learner,
                publisher=Publisher(transport, account),
                collector=collector,
                swarm=swarm,
                local=kw["local"],
                external=kw["external"],
                sampler=kw["sampler"],
                per_producer_cap=kw["per_producer_cap"],
                max_staleness_rounds=kw["max_staleness_rounds"],
                recorder=recorder,
                rounds=kw["rounds"],
                seed=kw["seed"],
                offload=True,
                limiter=kw["limiter"],
                include_tokens=kw["include_tokens"],
                checkpoint_dir=checkpoint_dir,
                checkpoint_every=kw["checkpoint_every"],
                drain_timeout_s=kw["drain_timeout_s"],
                overlap=kw["overlap"],
                sleep_mode=kw["sleep_mode"],
            )
            # The node's cleanup stack unwinds last-in first-out: journal, ledger, transport,
            # then the embedded server.
            for cleanup in cleanups:
                node.add_cleanup(_Callback(cleanup))
            cleanups = []
            await node.start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                for cleanup in reversed(cleanups):
                    await cleanup()
            raise
        return node


def _redact(url: str) -> str:
    """A URL list without credentials, for logs."""
    return ",".join(part.rsplit("@", 1)[-1] for part in url.split(","))


async def _connect_with_backoff(connect: Any, *, what: str, timeout_s: float) -> Any:
    """Call ``connect()`` until it succeeds, backing off 0.5 s doubling to 10 s.

    Raises:
        TransportUnavailable: still unreachable after ``timeout_s``.
    """
    delay = 0.5
    deadline = anyio.current_time() + timeout_s
    while True:
        try:
            return await connect()
        except TransportUnavailable as exc:
            if anyio.current_time() + delay > deadline:
                raise TransportUnavailable(
                    f"{what} still unreachable after {timeout_s:.0f} s: {exc}"
                ) from exc
            _log.warning("waiting_for_nats", target=what, retry_in_s=delay, error=str(exc))
            await anyio.sleep(delay)
            delay = min(delay * 2, 10.0)


class _Callback:
    def __init__(self, fn: Any) -> None:
        self._fn = fn

    async def aclose(self) -> None:
        await self._fn()


async def _make_recorder(
    ledger_opt: bool | str,
    *,
    contract_address: str | None,
    relayer_key: str | None,
    swarm: str,
    account: LocalAccount,
    learner: LocalTrainerNode,
    journal_path: Path | None,
    cleanups: list[Any],
) -> tuple[Any, Any]:
    from sapo_async.ledger.connect import connect_ledger
    from sapo_async.ledger.journal import Journal
    from sapo_async.ledger.recorder import Recorder

    if ledger_opt is True:
        handle = await _EMBEDDED.acquire_ledger(swarm)
        cleanups.append(lambda: _EMBEDDED.release_ledger(swarm))
        ledger = handle.ledger
        path = journal_path or handle.journal_dir / f"{account.address}.sqlite"
    else:
        if not contract_address:
            raise ConfigError(
                "a ledger RPC URL needs the contract address", field="ledger.contract_address"
            )
        ledger = connect_ledger(str(ledger_opt), contract_address, relayer_key=relayer_key)
        if journal_path is None:
            raise ConfigError("a ledger RPC URL needs a journal path", field="ledger.journal")
        path = journal_path
    journal = Journal(path)

    async def close_journal() -> None:
        journal.close()

    cleanups.append(close_journal)
    return Recorder(ledger, journal, account, metadata=learner.model_id), journal
