// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Nonces} from "@openzeppelin/contracts/utils/Nonces.sol";
import {SapoLedger} from "../src/SapoLedger.sol";
import {ISapoLedgerErrors} from "../src/ISapoLedgerErrors.sol";
import {LedgerTestBase} from "./LedgerTestBase.sol";

/// @dev `commitManyBySig`: a relayer lands a gasless node's backlog in one transaction, one signature per round
/// with consecutive nonces, all rounds or none, under every rule of `commitBySig`.
contract SapoLedgerBatchSigTest is LedgerTestBase {
    uint256 internal constant ALICE_PK = 0xA11CE;
    uint256 internal constant BOB_PK = 0xB0B;
    SapoLedger internal ledger;
    address internal alice;
    address internal relayer = address(0xBEEF);

    function setUp() public {
        ledger = new SapoLedger(keccak256("batchsig-swarm"));
        alice = vm.addr(ALICE_PK);
        vm.prank(alice);
        ledger.register("node");
    }

    function test_CommitManyBySigLandsEveryRoundAndUsesEachNonce() public {
        (SapoLedger.CommitmentInput[] memory cs, bytes[] memory sigs) = _signed(ALICE_PK, 3, 4, 0);
        vm.roll(9);
        vm.prank(relayer);
        ledger.commitManyBySig(alice, cs, 0, sigs);
        assertEq(ledger.nodeInfo(alice).roundsCommitted, 4, "every round");
        assertEq(ledger.nodeInfo(alice).lastRound, 6, "the last round of the batch");
        assertEq(ledger.commitmentOf(alice, 5).committedAt, 9, "one block");
        assertEq(ledger.nonces(alice), 4, "one nonce per round");
    }

    /// A relayer cannot drop, reorder or swap a round: each signature binds its round to its nonce.
    function test_RevertIf_TheRelayerReordersTheRounds_NothingLands() public {
        (SapoLedger.CommitmentInput[] memory cs, bytes[] memory sigs) = _signed(ALICE_PK, 1, 3, 0);
        (cs[0], cs[1]) = (cs[1], cs[0]);
        (sigs[0], sigs[1]) = (sigs[1], sigs[0]);
        vm.prank(relayer); // the recovered signer is some other address: only the error's name is known
        (bool ok, bytes memory ret) = address(ledger).call(abi.encodeCall(ledger.commitManyBySig, (alice, cs, 0, sigs)));
        assertTrue(!ok, "refused");
        // forge-lint: disable-next-line(unsafe-typecast)
        assertEq(bytes4(ret), ISapoLedgerErrors.SapoLedgerInvalidSigner.selector, "as signed by another key");
        assertEq(ledger.nodeInfo(alice).roundsCommitted, 0, "nothing landed");
        assertEq(ledger.nonces(alice), 0, "no nonce used");
    }

    function test_RevertIf_OneRoundIsSignedByAnotherKey_NothingLands() public {
        (SapoLedger.CommitmentInput[] memory cs, bytes[] memory sigs) = _signed(ALICE_PK, 1, 3, 0);
        sigs[2] = _sign(ledger, BOB_PK, alice, cs[2], 2);
        vm.expectRevert(
            abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerInvalidSigner.selector, vm.addr(BOB_PK), alice)
        );
        vm.prank(relayer);
        ledger.commitManyBySig(alice, cs, 0, sigs);
        assertEq(ledger.nodeInfo(alice).roundsCommitted, 0, "nothing landed");
    }

    function test_RevertIf_ABatchIsReplayed() public {
        (SapoLedger.CommitmentInput[] memory cs, bytes[] memory sigs) = _signed(ALICE_PK, 1, 2, 0);
        vm.prank(relayer);
        ledger.commitManyBySig(alice, cs, 0, sigs);
        vm.expectRevert(abi.encodeWithSelector(Nonces.InvalidAccountNonce.selector, alice, 2));
        vm.prank(relayer);
        ledger.commitManyBySig(alice, cs, 0, sigs);
    }

    /// A prefix of a signed batch is itself a valid batch (its nonces still start at the node's next).
    function test_APrefixOfASignedBatchLands() public {
        (SapoLedger.CommitmentInput[] memory cs, bytes[] memory sigs) = _signed(ALICE_PK, 1, 3, 0);
        SapoLedger.CommitmentInput[] memory head = new SapoLedger.CommitmentInput[](2);
        bytes[] memory headSigs = new bytes[](2);
        for (uint256 i = 0; i < 2; ++i) {
            (head[i], headSigs[i]) = (cs[i], sigs[i]);
        }
        vm.prank(relayer);
        ledger.commitManyBySig(alice, head, 0, headSigs);
        vm.prank(relayer);
        ledger.commitBySig(alice, cs[2], 2, sigs[2]);
        assertEq(ledger.nodeInfo(alice).lastRound, 3, "the rest lands after it");
    }

    function test_RevertIf_SignaturesAndCommitmentsDifferInNumber() public {
        (SapoLedger.CommitmentInput[] memory cs, bytes[] memory sigs) = _signed(ALICE_PK, 1, 2, 0);
        bytes[] memory one = new bytes[](1);
        one[0] = sigs[0];
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerSignatureCount.selector, 1, 2));
        vm.prank(relayer);
        ledger.commitManyBySig(alice, cs, 0, one);
    }

    function test_RevertIf_RelayedBatchEmptyOrLongerThanMax() public {
        uint256 max = ledger.MAX_BATCH();
        (SapoLedger.CommitmentInput[] memory cs, bytes[] memory sigs) = _signed(ALICE_PK, 1, max + 1, 0);
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerBatchLength.selector, max + 1, max));
        ledger.commitManyBySig(alice, cs, 0, sigs);
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerBatchLength.selector, 0, max));
        ledger.commitManyBySig(alice, new SapoLedger.CommitmentInput[](0), 0, new bytes[](0));
    }

    /// @dev `n` commitments of rounds `first`, ... signed by `pk` with nonces `nonce`, `nonce + 1`, ...
    function _signed(uint256 pk, uint64 first, uint256 n, uint256 nonce)
        private
        view
        returns (SapoLedger.CommitmentInput[] memory cs, bytes[] memory sigs)
    {
        cs = new SapoLedger.CommitmentInput[](n);
        sigs = new bytes[](n);
        for (uint256 i = 0; i < n; ++i) {
            // forge-lint: disable-next-line(unsafe-typecast)
            uint64 r = first + uint64(i);
            cs[i] = _input(r, keccak256(abi.encode("round", r)), 2);
            sigs[i] = _sign(ledger, pk, vm.addr(pk), cs[i], nonce + i);
        }
    }
}
