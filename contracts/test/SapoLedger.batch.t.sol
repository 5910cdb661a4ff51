// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {SapoLedger} from "../src/SapoLedger.sol";
import {ISapoLedgerErrors} from "../src/ISapoLedgerErrors.sol";
import {LedgerTestBase} from "./LedgerTestBase.sol";

/// @dev `commitMany`: a node's backlog as one transaction, all rounds or none, under every rule of `commit`
/// (round order, usage shape, the credit rules of issue 12), the later rounds of a batch seeing the earlier ones.
contract SapoLedgerBatchTest is LedgerTestBase {
    SapoLedger internal ledger;
    address internal alice = address(0xA11CE);
    address internal bob = address(0xB0B);

    function setUp() public {
        ledger = new SapoLedger(keccak256("batch-swarm"));
        vm.prank(alice);
        ledger.register("node");
        vm.prank(bob);
        ledger.register("node");
    }

    function test_CommitManyLandsEveryRoundInOrderInOneBlock() public {
        SapoLedger.CommitmentInput[] memory cs = _rounds(3, 5);
        vm.roll(7);
        vm.prank(alice);
        ledger.commitMany(cs);
        SapoLedger.NodeInfo memory info = ledger.nodeInfo(alice);
        assertEq(info.roundsCommitted, 5, "every round");
        assertEq(info.lastRound, 7, "the last round of the batch");
        assertEq(info.rolloutsCommitted, 5 * 2, "totals of every round");
        for (uint64 r = 3; r <= 7; ++r) {
            assertEq(ledger.commitmentOf(alice, r).committedAt, 7, "same block");
        }
    }

    function test_ABatchOfOneStoresWhatCommitStores() public {
        SapoLedger.CommitmentInput[] memory cs = new SapoLedger.CommitmentInput[](1);
        cs[0] = _input(4, keccak256("r4"), 3);
        vm.prank(alice);
        ledger.commitMany(cs);
        vm.prank(bob);
        ledger.commit(_input(4, keccak256("r4"), 3));
        assertEq(
            keccak256(abi.encode(ledger.commitmentOf(alice, 4))),
            keccak256(abi.encode(ledger.commitmentOf(bob, 4))),
            "same commitment"
        );
    }

    /// One refused round reverts the batch: the rounds before it do not land, and nothing moves.
    function test_RevertIf_OneRoundOfABatchIsRefused_NothingLands() public {
        vm.prank(alice);
        ledger.commit(_input(1, keccak256("r1"), 1));
        SapoLedger.CommitmentInput[] memory cs = _rounds(2, 4);
        cs[2].rolloutCount = 0; // root without a count
        vm.expectRevert(
            abi.encodeWithSelector(
                ISapoLedgerErrors.SapoLedgerRootCountMismatch.selector, cs[2].rolloutRoot, uint32(0)
            )
        );
        vm.prank(alice);
        ledger.commitMany(cs);
        _assertOnlyRoundOne();
    }

    function test_RevertIf_RoundNotIncreasingWithinABatch() public {
        vm.prank(alice);
        ledger.commit(_input(1, keccak256("r1"), 1));
        SapoLedger.CommitmentInput[] memory cs = _rounds(2, 3);
        cs[2].round = 3; // repeats the round before it in the same batch
        vm.expectRevert(
            abi.encodeWithSelector(
                ISapoLedgerErrors.SapoLedgerRoundNotIncreasing.selector, alice, uint64(3), uint64(3)
            )
        );
        vm.prank(alice);
        ledger.commitMany(cs);
        _assertOnlyRoundOne();
    }

    function test_RevertIf_ABatchRepeatsALandedRound() public {
        vm.prank(alice);
        ledger.commit(_input(1, keccak256("r1"), 1));
        SapoLedger.CommitmentInput[] memory cs = _rounds(1, 2); // round 1 again, then 2
        vm.expectRevert(
            abi.encodeWithSelector(
                ISapoLedgerErrors.SapoLedgerRoundNotIncreasing.selector, alice, uint64(1), uint64(1)
            )
        );
        vm.prank(alice);
        ledger.commitMany(cs);
        _assertOnlyRoundOne();
    }

    function test_RevertIf_SelfUsageInsideABatch() public {
        vm.prank(alice);
        ledger.commit(_input(1, keccak256("r1"), 1));
        SapoLedger.CommitmentInput[] memory cs = _rounds(2, 2);
        cs[1] = _usage1(cs[1], alice, 1, 1); // alice credits her own round 1
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerSelfUsage.selector, alice));
        vm.prank(alice);
        ledger.commitMany(cs);
        _assertOnlyRoundOne();
    }

    /// The credit bound is per (consumer, producer round) over all commitments: two rounds of one batch share it.
    function test_RevertIf_CreditOfTwoRoundsOfABatchExceedsShared() public {
        vm.prank(bob);
        ledger.commit(_input(1, keccak256("bob1"), 4));
        vm.prank(alice);
        ledger.commit(_input(1, keccak256("r1"), 1));
        SapoLedger.CommitmentInput[] memory cs = _rounds(2, 2);
        cs[0] = _usage1(cs[0], bob, 1, 3);
        cs[1] = _usage1(cs[1], bob, 1, 3);
        vm.expectRevert(
            abi.encodeWithSelector(
                ISapoLedgerErrors.SapoLedgerCreditExceedsShared.selector, bob, uint64(1), uint256(6), uint32(4)
            )
        );
        vm.prank(alice);
        ledger.commitMany(cs);
        _assertOnlyRoundOne();
        assertEq(ledger.creditReceived(bob), 0, "no credit from the reverted batch");
        assertEq(ledger.creditedBy(alice, bob, 1), 0, "no counter from the reverted batch");
    }

    function test_RevertIf_ABatchCreditsAProducerRoundThatSharedNothing() public {
        vm.prank(bob);
        ledger.commit(_input(1, bytes32(0), 0)); // on chain, no rollouts
        SapoLedger.CommitmentInput[] memory cs = _rounds(1, 2);
        cs[1] = _usage1(cs[1], bob, 1, 1);
        vm.expectRevert(
            abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerProducerRoundNotCommitted.selector, bob, uint64(1))
        );
        vm.prank(alice);
        ledger.commitMany(cs);
        assertEq(ledger.roundCount(alice), 0, "nothing landed");
    }

    /// Within the bound, a batch credits and claims as separate commits would.
    function test_ABatchCreditsAndClaimsLikeSeparateCommits() public {
        vm.prank(bob);
        ledger.commit(_input(1, keccak256("bob1"), 4));
        SapoLedger.CommitmentInput[] memory cs = _rounds(1, 2);
        cs[0] = _usage1(cs[0], bob, 1, 2); // credited now
        cs[1] = _usage1(cs[1], bob, 2, 3); // bob's round 2 is not on chain: a claim
        vm.prank(alice);
        ledger.commitMany(cs);
        assertEq(ledger.creditReceived(bob), 2, "credited with the batch");
        assertEq(ledger.claimOf(alice, 2, bob, 2), 3, "claimed with the batch");
        vm.prank(bob);
        ledger.commit(_input(2, keccak256("bob2"), 3));
        ledger.settleCredit(alice, 2, bob, 2);
        assertEq(ledger.creditReceived(bob), 5, "settled");
    }

    /// `settleCredits`: every claim credited in one transaction, or none when one is refused.
    function test_SettleCreditsSettlesEveryClaimOrNone() public {
        SapoLedger.CommitmentInput[] memory cs = _rounds(1, 3);
        cs[0] = _usage1(cs[0], bob, 1, 2); // claims: bob's rounds 1 to 3 are not on chain yet
        cs[1] = _usage1(cs[1], bob, 2, 2);
        cs[2] = _usage1(cs[2], bob, 3, 3);
        vm.prank(alice);
        ledger.commitMany(cs);
        vm.startPrank(bob);
        ledger.commitMany(_rounds(1, 3)); // two rollouts each: round 3's claim of 3 exceeds it
        vm.stopPrank();
        SapoLedger.ClaimKey[] memory keys = new SapoLedger.ClaimKey[](3);
        for (uint64 r = 1; r <= 3; ++r) {
            keys[r - 1] = SapoLedger.ClaimKey(alice, r, bob, r);
        }
        vm.expectRevert(
            abi.encodeWithSelector(
                ISapoLedgerErrors.SapoLedgerCreditExceedsShared.selector, bob, uint64(3), uint256(3), uint32(2)
            )
        );
        ledger.settleCredits(keys);
        assertEq(ledger.creditReceived(bob), 0, "nothing settled");
        assertEq(ledger.claimOf(alice, 1, bob, 1), 2, "the first claim is still open");
        SapoLedger.ClaimKey[] memory two = new SapoLedger.ClaimKey[](2);
        (two[0], two[1]) = (keys[0], keys[1]);
        ledger.settleCredits(two);
        assertEq(ledger.creditReceived(bob), 4, "both settled");
        vm.expectRevert(
            abi.encodeWithSelector(
                ISapoLedgerErrors.SapoLedgerNothingToSettle.selector, alice, uint64(1), bob, uint64(1)
            )
        );
        ledger.settleCredits(two); // each claim is settled once
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerBatchLength.selector, 0, 64));
        ledger.settleCredits(new SapoLedger.ClaimKey[](0));
    }

    function test_RevertIf_BatchEmptyOrLongerThanMax() public {
        uint256 max = ledger.MAX_BATCH();
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerBatchLength.selector, 0, max));
        vm.prank(alice);
        ledger.commitMany(new SapoLedger.CommitmentInput[](0));
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerBatchLength.selector, max + 1, max));
        vm.prank(alice);
        ledger.commitMany(_rounds(1, max + 1));
        vm.prank(alice);
        ledger.commitMany(_rounds(1, max)); // the bound itself is allowed
        assertEq(ledger.roundCount(alice), max, "a full batch");
    }

    function test_RevertIf_BatchFromAnUnregisteredSender() public {
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerNotRegistered.selector, address(0xCAFE)));
        vm.prank(address(0xCAFE));
        ledger.commitMany(_rounds(1, 2));
    }

    /// The batch adds only its loop to the rounds' own execution (the saving, 21k and calldata per
    /// transaction, is outside the EVM's gas counter here: bench/ledger.py measures it on anvil).
    function test_GasPerRoundOfABatchIsAtMostThatOfCommit() public {
        vm.startPrank(alice);
        ledger.commit(_input(1, keccak256("warm"), 1));
        uint256 g0 = gasleft();
        for (uint64 r = 2; r < 10; ++r) {
            ledger.commit(_input(r, keccak256(abi.encode(r)), 2));
        }
        uint256 separate = g0 - gasleft();
        SapoLedger.CommitmentInput[] memory cs = _rounds(10, 8);
        g0 = gasleft();
        ledger.commitMany(cs);
        uint256 batched = g0 - gasleft();
        vm.stopPrank();
        assertTrue(batched <= separate + 8 * 500, "a batch's loop costs little per round");
    }

    // ------------------------------------------------------------------ helpers

    /// @dev `n` commitments of rounds `first`, `first + 1`, ..., two rollouts each.
    function _rounds(uint64 first, uint256 n) private pure returns (SapoLedger.CommitmentInput[] memory cs) {
        cs = new SapoLedger.CommitmentInput[](n);
        for (uint256 i = 0; i < n; ++i) {
            // forge-lint: disable-next-line(unsafe-typecast)
            uint64 r = first + uint64(i);
            cs[i] = _input(r, keccak256(abi.encode("round", r)), 2);
        }
    }

    function _assertOnlyRoundOne() private view {
        SapoLedger.NodeInfo memory info = ledger.nodeInfo(alice);
        assertEq(info.roundsCommitted, 1, "the batch reverted whole");
        assertEq(info.lastRound, 1, "lastRound unchanged");
        assertEq(ledger.commitmentOf(alice, 2).committedAt, 0, "no round of the batch stored");
    }
}
