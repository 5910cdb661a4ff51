"""The formats docs/ledger.md and docs/fabric.md print are the ones the code uses.

Another implementation is written from the docs, not from this code (an outside verifier
built a relayer from docs/ledger.md's EIP-712 type and had every signature refused while
the type lacked ``producerRounds``). So each printed format is read back out of the
Markdown and checked against the deployed contract (its typehashes, its digest, its ABI:
events, errors, functions, the CommitmentInput struct) or the wire structs, and a
one-character change to a printed format fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import msgspec
import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data

from sapo_async.ledger import EvmLedger, deploy_ledger, embedded_chain, fund
from sapo_async.ledger.artifacts import load_artifact
from sapo_async.ledger.signing import COMMITMENT_TYPES, REGISTRATION_TYPES
from sapo_async.ledger.types import CommitmentPayload
from sapo_async.wire.rollout import RolloutGroup, keccak256
from sapo_async.wire.signing import EIP191_PREFIX

DOCS = Path(__file__).resolve().parents[2] / "docs"
ABI: list[dict[str, Any]] = load_artifact("SapoLedger").abi


def _block_after(markdown: str, heading: str) -> list[str]:
    """The lines of the first fenced block after ``heading``."""
    rest = markdown.split(heading, 1)[1]
    block = rest.split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


def documented_eip712_types(markdown: str) -> dict[str, str]:
    """``{name: type string}`` of every EIP-712 type docs/ledger.md prints."""
    types = {}
    for line in _block_after(markdown, "### EIP-712"):
        name = line.split("(", 1)[0]
        types[name] = line.strip()
    return types


def _fields(type_string: str) -> list[dict[str, str]]:
    """An EIP-712 type string as eth-account's ``types`` entry."""
    inner = type_string.split("(", 1)[1].rstrip(")")
    return [dict(zip(("type", "name"), f.split(" "), strict=True)) for f in inner.split(",")]


def _typehash_constants() -> set[str]:
    return {
        f["name"]
        for f in ABI
        if f.get("type") == "function" and f["name"].endswith("_TYPEHASH") and not f["inputs"]
    }


@pytest.fixture(scope="module")
def ledger() -> EvmLedger:
    async def deploy() -> EvmLedger:
        chain = embedded_chain()
        deployer = Account.create()
        await fund(chain, deployer.address)
        deployed = await deploy_ledger(chain, deployer, "docs", relayer=deployer)
        assert isinstance(deployed, EvmLedger)
        return deployed

    import anyio

    return anyio.run(deploy)


def _call(ledger: EvmLedger, name: str, *args: Any) -> Any:
    contract = ledger.chain.w3.eth.contract(address=ledger.address, abi=ABI)
    return contract.functions[name](*args).call()


def test_every_documented_eip712_type_hashes_to_the_contracts_typehash(ledger: EvmLedger) -> None:
    documented = documented_eip712_types((DOCS / "ledger.md").read_text(encoding="utf-8"))
    # Every typehash the contract exposes is printed, and nothing else is.
    assert {f"{name.upper()}_TYPEHASH" for name in documented} == _typehash_constants()
    for name, type_string in documented.items():
        on_chain = bytes(_call(ledger, f"{name.upper()}_TYPEHASH"))
        assert keccak256(type_string.encode()) == on_chain, (
            f"docs/ledger.md's {name} type is not the contract's preimage: {type_string}"
        )
    # The Python signer uses the same types.
    assert _fields(documented["Commitment"]) == COMMITMENT_TYPES["Commitment"]
    assert _fields(documented["Registration"]) == REGISTRATION_TYPES["Registration"]


@pytest.mark.parametrize("case", range(3))
def test_a_relayer_written_from_the_docs_signs_the_contracts_digest(
    ledger: EvmLedger, case: int
) -> None:
    """What the outside verifier did: build the digest from the documented type alone."""
    documented = documented_eip712_types((DOCS / "ledger.md").read_text(encoding="utf-8"))
    producers = tuple(Account.from_key(keccak256(b"p%d" % i)).address for i in range(case))
    payload = CommitmentPayload(
        round=7 + case,
        policy_version=6 + case,
        rollout_root=keccak256(b"own%d" % case),
        rollout_count=3 + case,
        external_root=keccak256(b"ext%d" % case) if case else bytes(32),
        external_count=2 * case,
        producers=producers,
        producer_rounds=tuple(5 + i for i in range(case)),
        counts=tuple(2 for _ in range(case)),
    )
    node = Account.from_key(keccak256(b"node")).address
    message = {
        "node": node,
        "round": payload.round,
        "policyVersion": payload.policy_version,
        "rolloutRoot": payload.rollout_root,
        "rolloutCount": payload.rollout_count,
        "externalRoot": payload.external_root,
        "externalCount": payload.external_count,
        "producers": list(payload.producers),
        "producerRounds": list(payload.producer_rounds),
        "counts": list(payload.counts),
        "nonce": case,
    }
    domain = {
        "name": "SapoLedger",
        "version": "1",
        "chainId": ledger.chain.w3.eth.chain_id,
        "verifyingContract": ledger.address,
    }
    fields = _fields(documented["Commitment"])
    signable = encode_typed_data(
        domain, {"Commitment": fields}, {f["name"]: message[f["name"]] for f in fields}
    )
    from_docs = keccak256(b"\x19" + signable.version + signable.header + signable.body)
    on_chain = bytes(_call(ledger, "commitmentDigest", node, payload.as_abi(), case))
    assert from_docs == on_chain


def _printed_calls(text: str) -> dict[str, list[str]]:
    """Every ```name(args)``` docs/ledger.md prints, with its argument names."""
    return {
        m[1]: [a.strip() for a in m[2].split(",")] if m[2].strip() else []
        for m in re.finditer(r"`(\w+)\(([\w, ]*)\)`", text)
    }


def test_documented_events_and_errors_are_the_contracts() -> None:
    printed = _printed_calls((DOCS / "ledger.md").read_text(encoding="utf-8"))
    abi = {
        e["name"]: [i["name"] for i in e["inputs"]] for e in ABI if e["type"] in ("event", "error")
    }
    ours = {name: args for name, args in abi.items() if name in printed}
    assert {"NodeRegistered", "CommitmentRecorded", "UsageCredited"} <= set(ours)
    assert len([n for n in ours if n.startswith("SapoLedger")]) >= 5
    for name, args in ours.items():
        assert printed[name] == args, f"docs/ledger.md prints {name}({printed[name]})"


def test_documented_functions_exist_with_their_arity() -> None:
    """Argument names in the docs are short forms (``sig``, ``input``): only the count is
    the contract's."""
    printed = _printed_calls((DOCS / "ledger.md").read_text(encoding="utf-8"))
    functions = {f["name"]: len(f["inputs"]) for f in ABI if f["type"] == "function"}
    named = {name: args for name, args in printed.items() if name in functions}
    assert {"register", "registerBySig", "commit", "commitBySig", "commitmentDigest"} <= set(named)
    for name, args in named.items():
        assert len(args) == functions[name], f"docs/ledger.md prints {name}({', '.join(args)})"


def test_documented_commitment_input_is_the_contracts_struct() -> None:
    text = (DOCS / "ledger.md").read_text(encoding="utf-8")
    match = re.search(r"`CommitmentInput = \(([^)]*)\)`", text)
    assert match is not None
    printed = [tuple(f.strip().split(" ")) for f in match[1].split(",")]
    commit = next(f for f in ABI if f.get("name") == "commit")
    (struct,) = commit["inputs"]
    assert printed == [(c["type"], c["name"]) for c in struct["components"]]


def _msgpack_type(annotation: Any) -> str:
    if get_origin(annotation) is Annotated:  # a constrained value (a digest) keeps its type
        return _msgpack_type(get_args(annotation)[0])
    if annotation is str:
        return "str"
    if annotation is int:
        return "int"
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return "map"
    (item, _) = get_args(annotation)
    return f"array of {_msgpack_type(item)}"


def _body_table(markdown: str) -> dict[str, tuple[str, str]]:
    """``{key: (msgpack type, meaning)}`` of docs/fabric.md's field-by-field table, in order."""
    section = markdown.split("### The body, field by field", 1)[1].split("**Test vectors**", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_fabric_body_table_is_the_wire_struct_in_order() -> None:
    rows = _body_table((DOCS / "fabric.md").read_text(encoding="utf-8"))
    fields = RolloutGroup.__struct_fields__
    assert list(rows) == list(fields)
    hints = {f.name: f.type for f in msgspec.structs.fields(RolloutGroup)}
    for name in fields:
        assert rows[name][0] == _msgpack_type(hints[name]), f"docs/fabric.md types {name}"
        kind = hints[name]
        nested = kind if isinstance(kind, type) else get_args(kind)[0]
        if isinstance(nested, type) and issubclass(nested, msgspec.Struct):
            # The meaning cell names the nested struct's keys, in order.
            keys = re.findall(r"`(\w+)` \(", rows[name][1])
            assert keys == list(nested.__struct_fields__), f"docs/fabric.md's {name} keys"


def test_fabric_signing_prefix_is_the_one_signed() -> None:
    text = (DOCS / "fabric.md").read_text(encoding="utf-8")
    match = re.search(r'keccak256\(b"(.+?)" \+\+ rollout_hash\)', text)
    assert match is not None
    assert match[1].encode().decode("unicode_escape").encode("latin-1") == EIP191_PREFIX
