// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {SapoLedger} from "../src/SapoLedger.sol";
import {ISapoLedgerErrors} from "../src/ISapoLedgerErrors.sol";
import {ISapoLedgerEvents} from "../src/ISapoLedgerEvents.sol";
import {Nonces} from "@openzeppelin/contracts/utils/Nonces.sol";
import {LedgerTestBase} from "./LedgerTestBase.sol";

contract SapoLedgerTest is LedgerTestBase, ISapoLedgerEvents {
    SapoLedger internal ledger;
    uint256 internal constant ALICE_PK = 0xA11CE;
    uint256 internal constant BOB_PK = 0xB0B;
    uint256 internal constant CAROL_PK = 0xCA201;
    address internal alice;
    address internal bob;
    address internal carol;
    address internal relayer = address(0xBEEF);

    function setUp() public {
        ledger = new SapoLedger(keccak256("test-swarm"));
        alice = vm.addr(ALICE_PK);
        bob = vm.addr(BOB_PK);
        carol = vm.addr(CAROL_PK);
        vm.prank(alice);
        ledger.register("model:alice");
        vm.prank(bob);
        ledger.register("model:bob");
    }

    // ------------------------------------------------------------------ registration

    function test_RegisterRecordsNodeAndMetadata() public view {
        assertTrue(ledger.isRegistered(alice), "alice registered");
        assertEq(ledger.nodeCount(), 2, "two nodes");
        address[] memory page = ledger.nodes(0, 10);
        assertEq(page.length, 2, "page length");
        assertEq(page[0], alice, "first node");
        assertEq(keccak256(bytes(ledger.metadataOf(bob))), keccak256("model:bob"), "metadata");
        assertEq(ledger.swarm(), keccak256("test-swarm"), "swarm id");
    }

    function test_RevertIf_RegisterTwice() public {
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerAlreadyRegistered.selector, alice));
        vm.prank(alice);
        ledger.register("again");
    }

    function test_RegisterBySigFromRelayer() public {
        bytes32 structHash =
            keccak256(abi.encode(ledger.REGISTRATION_TYPEHASH(), carol, keccak256(bytes("model:carol")), uint256(0)));
        bytes32 digest = keccak256(abi.encodePacked(hex"1901", _domainSeparator(), structHash));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(CAROL_PK, digest);
        vm.prank(relayer);
        ledger.registerBySig(carol, "model:carol", 0, abi.encodePacked(r, s, v));
        assertTrue(ledger.isRegistered(carol), "carol registered by relayer");
        assertEq(ledger.nonces(carol), 1, "nonce consumed");
    }

    function test_NodesPageClipsPastTheEnd() public view {
        assertEq(ledger.nodes(5, 10).length, 0, "offset past end");
        assertEq(ledger.nodes(1, 10).length, 1, "clipped limit");
    }

    // ------------------------------------------------------------------ direct commitments

    function test_CommitStoresRootsAndTotals() public {
        vm.expectEmit(true, true, false, true);
        emit CommitmentRecorded(alice, 3, 3, keccak256("r3"), 8, bytes32(0), 0, alice);
        vm.prank(alice);
        ledger.commit(_input(3, keccak256("r3"), 8));
        vm.prank(alice);
        ledger.commit(_input(5, keccak256("r5"), 4));

        SapoLedger.Commitment memory c = ledger.commitmentOf(alice, 3);
        assertEq(c.rolloutRoot, keccak256("r3"), "root");
        assertEq(c.rolloutCount, 8, "count");
        assertTrue(c.committedAt != 0, "exists");
        assertEq(ledger.commitmentOf(alice, 4).committedAt, 0, "no round 4");
        SapoLedger.NodeInfo memory info = ledger.nodeInfo(alice);
        assertEq(info.roundsCommitted, 2, "rounds");
        assertEq(info.rolloutsCommitted, 12, "rollouts");
        assertEq(info.lastRound, 5, "last round");
        uint64[] memory rounds = ledger.roundsOf(alice, 0, 10);
        assertEq(rounds.length, 2, "rounds listed");
        assertEq(rounds[1], 5, "second round");
    }

    function test_CommitAllowsRoundZeroAndEmptyRounds() public {
        vm.prank(alice);
        ledger.commit(_input(0, bytes32(0), 0));
        assertEq(ledger.nodeInfo(alice).roundsCommitted, 1, "empty round recorded");
    }

    function test_RevertIf_CommitNotRegistered() public {
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerNotRegistered.selector, carol));
        vm.prank(carol);
        ledger.commit(_input(1, keccak256("x"), 1));
    }

    function test_RevertIf_RoundRepeated() public {
        vm.startPrank(alice);
        ledger.commit(_input(2, keccak256("a"), 1));
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerRoundNotIncreasing.selector, alice, 2, 2));
        ledger.commit(_input(2, keccak256("b"), 1));
        vm.stopPrank();
        assertEq(ledger.commitmentOf(alice, 2).rolloutRoot, keccak256("a"), "not overwritten");
    }

    function test_RevertIf_RoundBackFilled() public {
        vm.startPrank(alice);
        ledger.commit(_input(7, keccak256("a"), 1));
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerRoundNotIncreasing.selector, alice, 6, 7));
        ledger.commit(_input(6, keccak256("b"), 1));
        vm.stopPrank();
    }

    function test_RevertIf_RootAndCountDisagree() public {
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerRootCountMismatch.selector, bytes32(0), 3));
        vm.prank(alice);
        ledger.commit(_input(1, bytes32(0), 3));
    }

    // ------------------------------------------------------------------ usage credit

    function test_CommitCreditsProducers() public {
        (address lo, address hi) = bob < carol ? (bob, carol) : (carol, bob);
        address[] memory producers = new address[](2);
        producers[0] = lo;
        producers[1] = hi;
        uint32[] memory counts = new uint32[](2);
        counts[0] = 3;
        counts[1] = 5;
        vm.prank(carol);
        ledger.register("model:carol");
        _share(bob, 1, 5);
        _share(carol, 1, 5);
        vm.prank(alice);
        ledger.commit(_withUsage(_input(1, keccak256("a"), 8), producers, counts));
        assertEq(ledger.creditReceived(lo), 3, "credit lo");
        assertEq(ledger.creditReceived(hi), 5, "credit hi");
        assertEq(ledger.nodeInfo(alice).externalUsed, 8, "external used");
        assertEq(ledger.creditReceived(alice), 0, "no self credit");
    }

    function test_CommitCreditsSeveralRoundsOfOneProducer() public {
        _share(bob, 1, 2);
        _share(bob, 2, 3);
        address[] memory producers = new address[](2);
        producers[0] = bob;
        producers[1] = bob;
        uint64[] memory rounds = new uint64[](2);
        rounds[0] = 1;
        rounds[1] = 2;
        uint32[] memory counts = new uint32[](2);
        counts[0] = 2;
        counts[1] = 3;
        vm.prank(alice);
        ledger.commit(_withUsage(_input(1, bytes32(0), 0), producers, rounds, counts));
        assertEq(ledger.creditReceived(bob), 5, "both rounds credited");
        assertEq(ledger.creditedBy(alice, bob, 2), 3, "per round");
        rounds[1] = 1; // the same (producer, round) twice
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerProducersNotSorted.selector, bob, bob));
        vm.prank(alice);
        ledger.commit(_withUsage(_input(2, bytes32(0), 0), producers, rounds, counts));
    }

    function test_RevertIf_CreditedProducerRoundHasNoRollouts() public {
        vm.prank(bob);
        ledger.commit(_input(1, bytes32(0), 0)); // an empty round is committed but shared nothing
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerProducerRoundNotCommitted.selector, bob, 1));
        vm.prank(alice);
        ledger.commit(_usage1(_input(1, bytes32(0), 0), bob, 1, 1));
    }

    function test_GasPerCreditDoesNotDependOnRolloutCount() public {
        _share(bob, 1, 8);
        _share(bob, 2, 4096);
        _share(bob, 3, 8);
        vm.startPrank(alice);
        ledger.commit(_usage1(_input(1, keccak256("warm"), 1), bob, 3, 1)); // first write to alice's slots
        uint256 g0 = gasleft();
        ledger.commit(_usage1(_input(2, keccak256("a"), 8), bob, 1, 8));
        uint256 small = g0 - gasleft();
        g0 = gasleft();
        ledger.commit(_usage1(_input(3, keccak256("b"), 4096), bob, 2, 4096));
        uint256 large = g0 - gasleft();
        vm.stopPrank();
        assertTrue(large <= small + 200 && small <= large + 200, "credit gas independent of rollout count");
    }

    function test_RevertIf_ProducersUnsortedOrDuplicated() public {
        address[] memory producers = new address[](2);
        producers[0] = bob;
        producers[1] = bob;
        uint32[] memory counts = new uint32[](2);
        counts[0] = 1;
        counts[1] = 1;
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerProducersNotSorted.selector, bob, bob));
        vm.prank(alice);
        ledger.commit(_withUsage(_input(1, keccak256("a"), 1), producers, counts));
    }

    function test_RevertIf_SelfUsage() public {
        address[] memory producers = new address[](1);
        producers[0] = alice;
        uint32[] memory counts = new uint32[](1);
        counts[0] = 1;
        _share(alice, 0, 1); // alice shared a round: crediting it herself is still refused
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerSelfUsage.selector, alice));
        vm.prank(alice);
        ledger.commit(_withUsage(_input(1, keccak256("a"), 1), producers, counts));
    }

    function test_RevertIf_UsageSumDiffersFromExternalCount() public {
        address[] memory producers = new address[](1);
        producers[0] = bob;
        uint32[] memory counts = new uint32[](1);
        counts[0] = 2;
        SapoLedger.CommitmentInput memory c = _withUsage(_input(1, keccak256("a"), 1), producers, counts);
        c.externalCount = 3;
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerUsageSumMismatch.selector, 2, 3));
        vm.prank(alice);
        ledger.commit(c);
    }

    function test_RevertIf_UsageLengthsDiffer() public {
        SapoLedger.CommitmentInput memory c = _input(1, keccak256("a"), 1);
        c.producers = new address[](1);
        c.producers[0] = bob;
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerUsageLengthMismatch.selector, 1, 0, 0));
        vm.prank(alice);
        ledger.commit(c);
    }

    function test_RevertIf_ZeroUsage() public {
        address[] memory producers = new address[](1);
        producers[0] = bob;
        uint32[] memory counts = new uint32[](1);
        SapoLedger.CommitmentInput memory c = _input(1, keccak256("a"), 1);
        c.producers = producers;
        c.producerRounds = new uint64[](1);
        c.counts = counts;
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerZeroUsage.selector, bob));
        vm.prank(alice);
        ledger.commit(c);
    }

    function test_RevertIf_TooManyProducers() public {
        uint256 n = ledger.MAX_PRODUCERS() + 1;
        address[] memory producers = new address[](n);
        uint32[] memory counts = new uint32[](n);
        for (uint256 i = 0; i < n; ++i) {
            // forge-lint: disable-next-line(unsafe-typecast)
            producers[i] = address(uint160(0x1000 + i));
            counts[i] = 1;
        }
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerTooManyProducers.selector, n, n - 1));
        vm.prank(alice);
        ledger.commit(_withUsage(_input(1, keccak256("a"), 1), producers, counts));
    }

    // ------------------------------------------------------------------ relayed commitments

    function test_CommitBySigFromRelayer() public {
        SapoLedger.CommitmentInput memory c = _input(4, keccak256("r"), 16);
        bytes memory sig = _sign(ledger, ALICE_PK, alice, c, 0);
        vm.prank(relayer);
        ledger.commitBySig(alice, c, 0, sig);
        assertEq(ledger.commitmentOf(alice, 4).rolloutCount, 16, "relayed commitment stored");
        assertEq(ledger.nonces(alice), 1, "nonce consumed");
    }

    function test_RevertIf_CommitBySigSignedByAnotherKey() public {
        SapoLedger.CommitmentInput memory c = _input(4, keccak256("r"), 16);
        bytes memory sig = _sign(ledger, BOB_PK, alice, c, 0);
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerInvalidSigner.selector, bob, alice));
        vm.prank(relayer);
        ledger.commitBySig(alice, c, 0, sig);
    }

    function test_RevertIf_CommitBySigReplayed() public {
        SapoLedger.CommitmentInput memory c = _input(4, keccak256("r"), 16);
        bytes memory sig = _sign(ledger, ALICE_PK, alice, c, 0);
        vm.prank(relayer);
        ledger.commitBySig(alice, c, 0, sig);
        vm.expectRevert(abi.encodeWithSelector(Nonces.InvalidAccountNonce.selector, alice, 1));
        vm.prank(relayer);
        ledger.commitBySig(alice, c, 0, sig);
    }

    function test_RevertIf_OutstandingSignatureOutlivedItsNonce() public {
        // Two signatures made against nonce 0: once one lands, the other is dead even though
        // its round is higher. Nonces make every signature single-use, independent of rounds.
        SapoLedger.CommitmentInput memory c5 = _input(5, keccak256("r5"), 1);
        SapoLedger.CommitmentInput memory c9 = _input(9, keccak256("r9"), 1);
        bytes memory sig5 = _sign(ledger, ALICE_PK, alice, c5, 0);
        bytes memory sig9 = _sign(ledger, ALICE_PK, alice, c9, 0);
        vm.prank(relayer);
        ledger.commitBySig(alice, c5, 0, sig5);
        vm.expectRevert(abi.encodeWithSelector(Nonces.InvalidAccountNonce.selector, alice, 1));
        vm.prank(relayer);
        ledger.commitBySig(alice, c9, 0, sig9);
    }

    function test_RevertIf_CommitBySigAltered() public {
        SapoLedger.CommitmentInput memory c = _input(4, keccak256("r"), 16);
        bytes memory sig = _sign(ledger, ALICE_PK, alice, c, 0);
        c.rolloutCount = 17; // the relayer inflates the count: the recovered signer changes
        vm.prank(relayer);
        (bool ok,) = address(ledger).call(abi.encodeCall(SapoLedger.commitBySig, (alice, c, 0, sig)));
        assertTrue(!ok, "altered commitment must revert");
    }

    function test_RevertIf_SignatureFromAnotherLedger() public {
        SapoLedger other = new SapoLedger(keccak256("other-swarm"));
        SapoLedger.CommitmentInput memory c = _input(4, keccak256("r"), 16);
        bytes memory sig = _sign(other, ALICE_PK, alice, c, 0);
        vm.prank(relayer);
        (bool ok,) = address(ledger).call(abi.encodeCall(SapoLedger.commitBySig, (alice, c, 0, sig)));
        assertTrue(!ok, "signature bound to another domain must revert");
    }

    // ------------------------------------------------------------------ Merkle proofs

    function test_IsRolloutIncludedWithProof() public {
        bytes32[3] memory hashes = [keccak256("h0"), keccak256("h1"), keccak256("h2")];
        bytes32 n01 = _hashPair(_leaf(hashes[0]), _leaf(hashes[1]));
        bytes32 root = _hashPair(n01, _leaf(hashes[2]));
        vm.prank(alice);
        ledger.commit(_input(1, root, 3));

        bytes32[] memory proof = new bytes32[](2);
        proof[0] = _leaf(hashes[1]);
        proof[1] = _leaf(hashes[2]);
        assertTrue(ledger.isRolloutIncluded(alice, 1, hashes[0], proof), "h0 included");
        assertTrue(!ledger.isRolloutIncluded(alice, 1, keccak256("other"), proof), "other not included");
        assertTrue(!ledger.isRolloutIncluded(alice, 2, hashes[0], proof), "no such round");
        assertTrue(!ledger.isRolloutIncluded(bob, 1, hashes[0], proof), "no such node");
        bytes32[] memory short = new bytes32[](1);
        short[0] = _leaf(hashes[2]);
        assertTrue(!ledger.isRolloutIncluded(alice, 1, n01, short), "an internal node is not a rollout");
    }

    function test_GasPerCommitmentDoesNotDependOnRolloutCount() public {
        vm.startPrank(alice);
        ledger.commit(_input(1, keccak256("warm"), 1)); // first write to the node's slots
        uint256 g0 = gasleft();
        ledger.commit(_input(2, keccak256("a"), 8));
        uint256 small = g0 - gasleft();
        g0 = gasleft();
        ledger.commit(_input(3, keccak256("b"), 4096));
        uint256 large = g0 - gasleft();
        vm.stopPrank();
        assertTrue(large <= small + 200 && small <= large + 200, "gas independent of rollout count");
    }

    // ------------------------------------------------------------------ fuzz

    function testFuzz_RoundsStrictlyIncrease(uint64 first, uint64 second) public {
        first = uint64(bound(first, 0, ledger.MAX_ROUND_STEP()));
        second = uint64(bound(second, 0, uint256(first) + ledger.MAX_ROUND_STEP()));
        vm.startPrank(alice);
        ledger.commit(_input(first, keccak256("first"), 1));
        if (second <= first) {
            vm.expectRevert(
                abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerRoundNotIncreasing.selector, alice, second, first)
            );
        }
        ledger.commit(_input(second, keccak256("second"), 2));
        vm.stopPrank();
        assertEq(ledger.commitmentOf(alice, first).rolloutRoot, keccak256("first"), "first kept");
    }

    function testFuzz_RevertIf_RelaySignedByAnotherKey(uint256 pk, uint64 round, bytes32 root) public {
        pk = bound(pk, 1, 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364140);
        vm.assume(pk != ALICE_PK);
        vm.assume(root != bytes32(0));
        SapoLedger.CommitmentInput memory c = _input(round, root, 1);
        bytes memory sig = _sign(ledger, pk, alice, c, 0);
        vm.expectRevert(abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerInvalidSigner.selector, vm.addr(pk), alice));
        vm.prank(relayer);
        ledger.commitBySig(alice, c, 0, sig);
    }

    function testFuzz_RelayedNonceMustMatch(uint256 nonce) public {
        vm.assume(nonce != 0);
        SapoLedger.CommitmentInput memory c = _input(1, keccak256("r"), 1);
        bytes memory sig = _sign(ledger, ALICE_PK, alice, c, nonce);
        vm.expectRevert(abi.encodeWithSelector(Nonces.InvalidAccountNonce.selector, alice, 0));
        vm.prank(relayer);
        ledger.commitBySig(alice, c, nonce, sig);
    }

    function testFuzz_MerkleProofsOfFourLeaves(bytes32 a, bytes32 b, bytes32 c, bytes32 d) public {
        bytes32[4] memory leaves = [_leaf(a), _leaf(b), _leaf(c), _leaf(d)];
        bytes32 left = _hashPair(leaves[0], leaves[1]);
        bytes32 right = _hashPair(leaves[2], leaves[3]);
        vm.prank(alice);
        ledger.commit(_input(1, _hashPair(left, right), 4));
        bytes32[] memory proof = new bytes32[](2);
        proof[0] = leaves[3];
        proof[1] = left;
        assertTrue(ledger.isRolloutIncluded(alice, 1, c, proof), "c included");
        proof[0] = leaves[1];
        proof[1] = right;
        assertTrue(ledger.isRolloutIncluded(alice, 1, a, proof), "a included");
    }

    function testFuzz_CreditAccumulates(uint32 x, uint32 y) public {
        x = uint32(bound(x, 1, ledger.MAX_ROLLOUTS_PER_ROUND()));
        y = uint32(bound(y, 1, ledger.MAX_ROLLOUTS_PER_ROUND()));
        _share(bob, 1, x);
        _share(bob, 2, y);
        vm.prank(alice);
        ledger.commit(_usage1(_input(1, keccak256("a"), 1), bob, 1, x));
        vm.prank(alice);
        ledger.commit(_usage1(_input(2, keccak256("b"), 1), bob, 2, y));
        assertEq(ledger.creditReceived(bob), uint256(x) + y, "credit is the sum of usage");
        assertEq(ledger.nodeInfo(alice).externalUsed, uint256(x) + y, "external used is the same sum");
    }

    // ------------------------------------------------------------------ credit rules (fuzz)

    /// Credit for one producer round, summed over a consumer's commitments, never passes what was shared.
    function testFuzz_CreditNeverExceedsWhatTheProducerShared(uint32 shared, uint32 first, uint32 second) public {
        shared = uint32(bound(shared, 1, ledger.MAX_ROLLOUTS_PER_ROUND()));
        first = uint32(bound(first, 1, ledger.MAX_ROLLOUTS_PER_ROUND()));
        second = uint32(bound(second, 1, ledger.MAX_ROLLOUTS_PER_ROUND()));
        _share(bob, 7, shared);
        SapoLedger.CommitmentInput memory c = _usage1(_input(1, bytes32(0), 0), bob, 7, first);
        if (first > shared) {
            vm.expectRevert(
                abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerCreditExceedsShared.selector, bob, 7, first, shared)
            );
        }
        vm.prank(alice);
        ledger.commit(c);
        uint256 credited = first > shared ? 0 : first;
        c = _usage1(_input(2, bytes32(0), 0), bob, 7, second);
        if (credited + second > shared) {
            vm.expectRevert(
                abi.encodeWithSelector(
                    ISapoLedgerErrors.SapoLedgerCreditExceedsShared.selector, bob, 7, credited + second, shared
                )
            );
        } else {
            credited += second;
        }
        vm.prank(alice);
        ledger.commit(c);
        assertEq(ledger.creditedBy(alice, bob, 7), credited, "credited by alice");
        assertEq(ledger.creditReceived(bob), credited, "credit received");
        assertTrue(credited <= shared, "credit within what was shared");
    }

    /// Credit names a producer round that exists: usage of any other round of the producer lands as a claim
    /// that credits nothing, and settling it is refused while that round is not on chain.
    function testFuzz_UsageOfAnUncommittedRoundCreditsNothing(uint64 sharedRound, uint64 creditedRound) public {
        sharedRound = uint64(bound(sharedRound, 0, ledger.MAX_ROUND_STEP()));
        vm.assume(creditedRound != sharedRound);
        _share(bob, sharedRound, 4);
        vm.prank(alice);
        ledger.commit(_usage1(_input(1, bytes32(0), 0), bob, creditedRound, 1));
        assertEq(ledger.creditReceived(bob), 0, "no credit");
        assertEq(ledger.claimOf(alice, 1, bob, creditedRound), 1, "claim kept");
        vm.expectRevert(
            abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerProducerRoundNotCommitted.selector, bob, creditedRound)
        );
        ledger.settleCredit(alice, 1, bob, creditedRound);
    }

    // ------------------------------------------------------------------ deferred credit

    /// The consumer's round lands before the producer's; anyone settles the claim once the producer's lands.
    function test_ClaimOnALaterProducerRoundIsSettledByAnyone() public {
        vm.prank(alice);
        ledger.commit(_usage1(_input(1, keccak256("a1"), 2), bob, 5, 3));
        assertEq(ledger.nodeInfo(alice).roundsCommitted, 1, "consumer's round landed first");
        assertEq(ledger.claimOf(alice, 1, bob, 5), 3, "claimed");
        _share(bob, 5, 4);
        vm.prank(carol); // not a node at all
        ledger.settleCredit(alice, 1, bob, 5);
        assertEq(ledger.creditReceived(bob), 3, "credited");
        assertEq(ledger.creditedBy(alice, bob, 5), 3, "per round");
        assertEq(ledger.claimOf(alice, 1, bob, 5), 0, "claim cleared");
        vm.expectRevert(
            abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerNothingToSettle.selector, alice, uint64(1), bob, uint64(5))
        );
        ledger.settleCredit(alice, 1, bob, 5);
        assertEq(ledger.creditReceived(bob), 3, "settled once");
    }

    /// A claim above what the producer round turns out to share is refused at settlement, like a commitment.
    function test_RevertIf_SettledClaimExceedsShared() public {
        vm.prank(alice);
        ledger.commit(_usage1(_input(1, bytes32(0), 0), bob, 2, 9));
        _share(bob, 2, 4);
        vm.expectRevert(
            abi.encodeWithSelector(
                ISapoLedgerErrors.SapoLedgerCreditExceedsShared.selector, bob, uint64(2), uint256(9), uint32(4)
            )
        );
        ledger.settleCredit(alice, 1, bob, 2);
        assertEq(ledger.creditReceived(bob), 0, "nothing credited");
    }

    /// Immediate credit and settled claims of one consumer share one bound per producer round.
    function test_RevertIf_ClaimAndCommitTogetherExceedShared() public {
        vm.prank(alice);
        ledger.commit(_usage1(_input(1, bytes32(0), 0), bob, 2, 3)); // claim: bob's round 2 not yet on chain
        _share(bob, 2, 4);
        vm.prank(alice);
        ledger.commit(_usage1(_input(2, bytes32(0), 0), bob, 2, 3)); // credited now: 3 of 4
        vm.expectRevert(
            abi.encodeWithSelector(
                ISapoLedgerErrors.SapoLedgerCreditExceedsShared.selector, bob, uint64(2), uint256(6), uint32(4)
            )
        );
        ledger.settleCredit(alice, 1, bob, 2);
    }

    /// A claim costs less than a credit, and its settlement no more than the credit it replaces plus a transaction.
    function test_GasOfAClaimDoesNotDependOnRolloutCount() public {
        vm.startPrank(alice);
        ledger.commit(_usage1(_input(1, keccak256("warm"), 1), bob, 9, 1)); // first write to alice's slots
        uint256 g0 = gasleft();
        ledger.commit(_usage1(_input(2, keccak256("a"), 8), bob, 1, 8));
        uint256 small = g0 - gasleft();
        g0 = gasleft();
        ledger.commit(_usage1(_input(3, keccak256("b"), 4096), bob, 2, 4096));
        uint256 large = g0 - gasleft();
        vm.stopPrank();
        assertTrue(large <= small + 200 && small <= large + 200, "claim gas independent of rollout count");
    }

    /// A round more than MAX_ROUND_STEP above the last is refused, so a node can always commit again.
    function testFuzz_RoundStepIsBounded(uint64 first, uint64 next) public {
        uint64 step = ledger.MAX_ROUND_STEP();
        first = uint64(bound(first, 0, step));
        vm.startPrank(alice);
        ledger.commit(_input(first, keccak256("first"), 1));
        if (next > first + step) {
            vm.expectRevert(
                abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerRoundTooFar.selector, alice, next, first + step)
            );
            ledger.commit(_input(next, keccak256("next"), 1));
            next = first + step;
        }
        if (next > first) ledger.commit(_input(next, keccak256("next"), 1));
        vm.stopPrank();
        uint64 last = ledger.nodeInfo(alice).lastRound;
        assertTrue(last < type(uint64).max, "a later round is always possible");
    }

    /// Counts above MAX_ROLLOUTS_PER_ROUND are refused whatever the root.
    function testFuzz_RevertIf_CountAboveBound(uint32 count, bytes32 root) public {
        vm.assume(root != bytes32(0));
        count = uint32(bound(count, uint256(ledger.MAX_ROLLOUTS_PER_ROUND()) + 1, type(uint32).max));
        vm.expectRevert(
            abi.encodeWithSelector(ISapoLedgerErrors.SapoLedgerCountTooLarge.selector, count, ledger.MAX_ROLLOUTS_PER_ROUND())
        );
        vm.prank(alice);
        ledger.commit(_input(1, root, count));
    }

    function _share(address producer, uint64 round, uint32 count) private {
        vm.prank(producer);
        ledger.commit(_input(round, keccak256(abi.encode(producer, round)), count));
    }

    function _domainSeparator() private view returns (bytes32) {
        (, string memory name, string memory version, uint256 chainId, address verifying,,) = ledger.eip712Domain();
        return keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256(bytes(name)),
                keccak256(bytes(version)),
                chainId,
                verifying
            )
        );
    }
}
