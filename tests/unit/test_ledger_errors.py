"""Foreign exceptions become LedgerErrors at the web3 adapter, with the revert decoded."""

from __future__ import annotations

import pytest
import requests
from eth_abi.abi import encode
from eth_utils import ValidationError
from web3.exceptions import ContractCustomError, TimeExhausted

from sapo_async.errors import CommitmentRejected, LedgerError, LedgerUnavailable
from sapo_async.ledger.chain import decode_revert, translate_errors
from sapo_async.wire.rollout import keccak256

NODE = "0x" + "ab" * 20
SELECTOR = keccak256(b"SapoLedgerRoundNotIncreasing(address,uint64,uint64)")[:4]
REVERT = SELECTOR + encode(["address", "uint64", "uint64"], [NODE, 3, 7])


def test_revert_data_decodes_to_the_custom_error_and_its_values():
    name, message = decode_revert(REVERT)
    assert name == "SapoLedgerRoundNotIncreasing"
    assert message == f"SapoLedgerRoundNotIncreasing(node={NODE}, round=3, lastRound=7)"
    assert decode_revert(b"\x01\x02\x03\x04")[0] == "unknown"
    error_string = keccak256(b"Error(string)")[:4] + encode(["string"], ["boom"])
    assert decode_revert(error_string) == ("Error", "boom")


@pytest.mark.parametrize(
    ("signature", "types", "values", "text"),
    [
        (
            "SapoLedgerProducerRoundNotCommitted(address,uint64)",
            ["address", "uint64"],
            [NODE, 4],
            f"SapoLedgerProducerRoundNotCommitted(producer={NODE}, producerRound=4)",
        ),
        (
            "SapoLedgerCreditExceedsShared(address,uint64,uint256,uint32)",
            ["address", "uint64", "uint256", "uint32"],
            [NODE, 4, 9, 8],
            f"SapoLedgerCreditExceedsShared(producer={NODE}, producerRound=4, credited=9, "
            "shared=8)",
        ),
        (
            "SapoLedgerCountTooLarge(uint32,uint32)",
            ["uint32", "uint32"],
            [2**32 - 1, 4096],
            f"SapoLedgerCountTooLarge(count={2**32 - 1}, max=4096)",
        ),
        (
            "SapoLedgerRoundTooFar(address,uint64,uint64)",
            ["address", "uint64", "uint64"],
            [NODE, 2**64 - 1, 2**32],
            f"SapoLedgerRoundTooFar(node={NODE}, round={2**64 - 1}, maxRound={2**32})",
        ),
    ],
)
def test_credit_rule_reverts_decode_with_their_values(signature, types, values, text):
    revert = keccak256(signature.encode())[:4] + encode(types, values)
    assert decode_revert(revert) == (signature.split("(")[0], text)


@pytest.mark.parametrize(
    "exc",
    [
        ContractCustomError("0x" + REVERT.hex(), data="0x" + REVERT.hex()),
        # eth-tester's TransactionFailed carries the bytes in its message
        type("TransactionFailed", (Exception,), {})(f"execution reverted: {REVERT!r}"),
    ],
)
def test_reverts_become_commitment_rejected_with_the_error_name(exc):
    with pytest.raises(CommitmentRejected) as info, translate_errors():
        raise exc
    assert info.value.reason == "SapoLedgerRoundNotIncreasing"
    assert info.value.__cause__ is exc


@pytest.mark.parametrize(
    "exc", [requests.exceptions.ConnectionError("refused"), TimeExhausted("slow"), OSError("x")]
)
def test_unreachable_endpoints_become_ledger_unavailable(exc):
    with pytest.raises(LedgerUnavailable), translate_errors():
        raise exc


def test_other_web3_stack_errors_become_ledger_errors_but_our_bugs_propagate():
    with pytest.raises(LedgerError), translate_errors():
        raise ValidationError("insufficient funds")
    with pytest.raises(KeyError), translate_errors():
        raise KeyError("a bug of ours")
