// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {SapoLedger} from "../src/SapoLedger.sol";
import {LedgerTestBase} from "./LedgerTestBase.sol";

/// @dev Drives the ledger with random direct, relayed, forged and replayed commitments from three
/// nodes, and keeps a ghost copy of every commitment that landed.
contract LedgerHandler is LedgerTestBase {
    SapoLedger public immutable ledger;
    uint256[3] internal _pks = [uint256(0xA11CE), uint256(0xB0B), uint256(0xCA201)];
    address[3] public nodes;

    struct Landed {
        address node;
        uint64 round;
        bytes32 root;
    }

    Landed[] public landed;
    mapping(address node => uint64[]) internal _ghostRounds;
    uint256 public forgedLanded;
    uint256 public replayLanded;
    uint256 public backFillLanded;

    struct Sent {
        address node;
        SapoLedger.CommitmentInput input;
        uint256 nonce;
        bytes signature;
    }

    Sent[] internal _sent;

    struct Credit {
        address consumer;
        address producer;
        uint64 producerRound;
    }

    Credit[] public credits;

    struct Claim {
        address consumer;
        uint64 round;
        address producer;
        uint64 producerRound;
    }

    Claim[] internal _claims;
    mapping(address producer => uint256) public ghostCredit;

    constructor(SapoLedger ledger_) {
        ledger = ledger_;
        for (uint256 i = 0; i < 3; ++i) {
            nodes[i] = vm.addr(_pks[i]);
            vm.prank(nodes[i]);
            ledger.register("node");
        }
    }

    function commitDirect(uint256 who, uint64 round, bytes32 root) external {
        address node = nodes[who % 3];
        _attempt(node, _input(_small(round), _nonZero(root), 1), false);
    }

    function commitRelayed(uint256 who, uint64 round, bytes32 root) external {
        uint256 i = who % 3;
        address node = nodes[i];
        SapoLedger.CommitmentInput memory c = _input(_small(round), _nonZero(root), 2);
        uint256 nonce = ledger.nonces(node);
        bytes memory sig = _sign(ledger, _pks[i], node, c, nonce);
        if (_attempt(node, c, true, nonce, sig)) {
            _sent.push();
            Sent storage s = _sent[_sent.length - 1];
            s.node = node;
            s.input = c;
            s.nonce = nonce;
            s.signature = sig;
        }
    }

    /// A relayer forwards a commitment for `nodes[who]` signed by another node's key.
    function commitForged(uint256 who, uint256 signerOffset, uint64 round, bytes32 root) external {
        uint256 i = who % 3;
        uint256 j = (i + 1 + (signerOffset % 2)) % 3;
        address node = nodes[i];
        SapoLedger.CommitmentInput memory c = _input(_small(round), _nonZero(root), 3);
        uint256 nonce = ledger.nonces(node);
        bytes memory sig = _sign(ledger, _pks[j], node, c, nonce);
        try ledger.commitBySig(node, c, nonce, sig) {
            forgedLanded += 1;
        } catch {}
    }

    /// A relayer sends an already-landed signed commitment again, as-is or for a fresh round.
    function replay(uint256 which, uint64 newRound) external {
        if (_sent.length == 0) return;
        Sent storage s = _sent[which % _sent.length];
        SapoLedger.CommitmentInput memory c = s.input;
        try ledger.commitBySig(s.node, c, s.nonce, s.signature) {
            replayLanded += 1;
        } catch {}
        c.round = _small(newRound);
        try ledger.commitBySig(s.node, c, s.nonce, s.signature) {
            replayLanded += 1;
        } catch {}
    }

    /// `nodes[who]` commits a round crediting `count` rollouts of `nodes[producer]`'s round `producerRound`:
    /// lands only within the credit rules; what lands is tracked so the invariants can check the bounds.
    function credit(uint256 who, uint256 producer, uint64 round, uint64 producerRound, uint32 count) external {
        address consumer = nodes[who % 3];
        address p = nodes[producer % 3];
        SapoLedger.CommitmentInput memory c =
            _usage1(_input(_small(round), bytes32(0), 0), p, _small(producerRound), uint32(bound(count, 1, 8)));
        bool onChain = ledger.commitmentOf(p, c.producerRounds[0]).committedAt != 0;
        if (_attempt(consumer, c, false)) {
            if (onChain) {
                credits.push(Credit(consumer, p, c.producerRounds[0]));
                ghostCredit[p] += c.counts[0];
            } else {
                _claims.push(Claim(consumer, c.round, p, c.producerRounds[0]));
            }
        }
    }

    /// Anyone settles a claim made earlier: it credits only within the credit rules, and only once.
    function settle(uint256 which) external {
        if (_claims.length == 0) return;
        Claim memory k = _claims[which % _claims.length];
        uint32 count = ledger.claimOf(k.consumer, k.round, k.producer, k.producerRound);
        try ledger.settleCredit(k.consumer, k.round, k.producer, k.producerRound) {
            credits.push(Credit(k.consumer, k.producer, k.producerRound));
            ghostCredit[k.producer] += count;
        } catch {}
    }

    /// `nodes[who]` sends up to three rounds as one `commitMany`, in steps of 0 to 2 (0: a repeat inside the
    /// batch): all land or none; what lands is checked against the ghost rounds one by one.
    function commitBatch(uint256 who, uint64 first, uint8 step, uint8 n) external {
        address node = nodes[who % 3];
        SapoLedger.CommitmentInput[] memory cs = new SapoLedger.CommitmentInput[](1 + (n % 3));
        uint64 round = _small(first);
        for (uint256 i = 0; i < cs.length; ++i) {
            cs[i] = _input(round, keccak256(abi.encode(node, round, i)), 1);
            round += uint64(step % 3);
        }
        vm.prank(node);
        try ledger.commitMany(cs) {
            for (uint256 i = 0; i < cs.length; ++i) {
                uint64[] storage rounds = _ghostRounds[node];
                if (rounds.length != 0 && cs[i].round <= rounds[rounds.length - 1]) backFillLanded += 1;
                rounds.push(cs[i].round);
                landed.push(Landed(node, cs[i].round, cs[i].rolloutRoot));
            }
        } catch {}
    }

    /// Anyone settles up to three claims made earlier as one `settleCredits`: all or none, each only once.
    function settleBatch(uint256 which, uint8 n) external {
        if (_claims.length == 0) return;
        SapoLedger.ClaimKey[] memory keys = new SapoLedger.ClaimKey[](1 + (n % 3));
        uint32[] memory counts = new uint32[](keys.length);
        for (uint256 i = 0; i < keys.length; ++i) {
            Claim memory k = _claims[(which % _claims.length + i) % _claims.length];
            keys[i] = SapoLedger.ClaimKey(k.consumer, k.round, k.producer, k.producerRound);
            counts[i] = ledger.claimOf(k.consumer, k.round, k.producer, k.producerRound);
        }
        try ledger.settleCredits(keys) {
            for (uint256 i = 0; i < keys.length; ++i) {
                credits.push(Credit(keys[i].consumer, keys[i].producer, keys[i].producerRound));
                ghostCredit[keys[i].producer] += counts[i];
            }
        } catch {}
    }

    /// A node commits the highest round it can name, trying to lock itself out.
    function commitFar(uint256 who, uint64 round) external {
        _attempt(nodes[who % 3], _input(round, keccak256("far"), 1), false);
    }

    function creditCount() external view returns (uint256) {
        return credits.length;
    }

    function landedCount() external view returns (uint256) {
        return landed.length;
    }

    function ghostRounds(address node) external view returns (uint64[] memory) {
        return _ghostRounds[node];
    }

    function _attempt(address node, SapoLedger.CommitmentInput memory c, bool relayed) private returns (bool) {
        return _attempt(node, c, relayed, 0, "");
    }

    function _attempt(
        address node,
        SapoLedger.CommitmentInput memory c,
        bool relayed,
        uint256 nonce,
        bytes memory sig
    ) private returns (bool ok) {
        uint64[] storage rounds = _ghostRounds[node];
        bool allowed = rounds.length == 0 || c.round > rounds[rounds.length - 1];
        if (c.round > uint256(rounds.length == 0 ? 0 : rounds[rounds.length - 1]) + ledger.MAX_ROUND_STEP()) {
            allowed = false;
        }
        if (relayed) {
            try ledger.commitBySig(node, c, nonce, sig) {
                ok = true;
            } catch {}
        } else {
            vm.prank(node);
            try ledger.commit(c) {
                ok = true;
            } catch {}
        }
        if (ok) {
            if (!allowed) backFillLanded += 1;
            rounds.push(c.round);
            landed.push(Landed(node, c.round, c.rolloutRoot));
        }
    }

    /// Rounds from a small range, so repeats, back-fills and credit of existing rounds are tried often.
    function _small(uint64 round) private pure returns (uint64) {
        return uint64(round % 16);
    }

    function _nonZero(bytes32 root) private pure returns (bytes32) {
        return root == bytes32(0) ? bytes32(uint256(1)) : root;
    }
}

contract SapoLedgerInvariantTest is LedgerTestBase {
    SapoLedger internal ledger;
    LedgerHandler internal handler;

    function setUp() public {
        ledger = new SapoLedger(keccak256("invariant-swarm"));
        handler = new LedgerHandler(ledger);
    }

    /// @dev Only the handler is called by the invariant fuzzer.
    function targetContracts() public view returns (address[] memory targets) {
        targets = new address[](1);
        targets[0] = address(handler);
    }

    /// Every commitment that ever landed is still stored unchanged: none is overwritten.
    function invariant_noCommitmentIsOverwritten() public view {
        uint256 n = handler.landedCount();
        for (uint256 i = 0; i < n; ++i) {
            (address node, uint64 round, bytes32 root) = handler.landed(i);
            SapoLedger.Commitment memory c = ledger.commitmentOf(node, round);
            assertEq(c.rolloutRoot, root, "commitment overwritten");
            assertTrue(c.committedAt != 0, "commitment vanished");
        }
    }

    /// Each node's committed rounds strictly increase, and the ledger lists exactly what landed.
    function invariant_roundsStrictlyIncreasePerNode() public view {
        assertEq(handler.backFillLanded(), 0, "a back-filled or repeated round landed");
        for (uint256 k = 0; k < 3; ++k) {
            address node = handler.nodes(k);
            uint64[] memory rounds = ledger.roundsOf(node, 0, type(uint256).max);
            uint64[] memory ghost = handler.ghostRounds(node);
            assertEq(rounds.length, ghost.length, "round list length");
            for (uint256 i = 0; i < rounds.length; ++i) {
                assertEq(rounds[i], ghost[i], "round list content");
                if (i > 0) assertTrue(rounds[i] > rounds[i - 1], "rounds not strictly increasing");
            }
            SapoLedger.NodeInfo memory info = ledger.nodeInfo(node);
            assertEq(info.roundsCommitted, rounds.length, "rounds committed total");
            if (rounds.length > 0) assertEq(info.lastRound, rounds[rounds.length - 1], "last round");
        }
    }

    /// No consumer's credit for a producer round exceeds what the producer committed for it, every credit
    /// names a round with rollouts, and the producers' totals are exactly the credit that landed.
    function invariant_creditNeverExceedsWhatWasShared() public view {
        uint256 n = handler.creditCount();
        for (uint256 i = 0; i < n; ++i) {
            (address consumer, address producer, uint64 round) = handler.credits(i);
            assertTrue(consumer != producer, "self credit landed");
            SapoLedger.Commitment memory shared = ledger.commitmentOf(producer, round);
            assertTrue(shared.committedAt != 0 && shared.rolloutCount != 0, "credit for a round never shared");
            assertTrue(ledger.creditedBy(consumer, producer, round) <= shared.rolloutCount, "credit above shared");
        }
        for (uint256 k = 0; k < 3; ++k) {
            address node = handler.nodes(k);
            assertEq(ledger.creditReceived(node), handler.ghostCredit(node), "credit total");
        }
    }

    /// No node ever reaches a round with no room above it: it can always commit again.
    function invariant_noNodeLocksItselfOut() public view {
        for (uint256 k = 0; k < 3; ++k) {
            SapoLedger.NodeInfo memory info = ledger.nodeInfo(handler.nodes(k));
            assertTrue(info.lastRound <= uint256(info.roundsCommitted) * ledger.MAX_ROUND_STEP(), "round ran away");
        }
    }

    /// A relayed commitment signed by another key, or a replayed signature, never lands.
    function invariant_forgedOrReplayedRelayNeverLands() public view {
        assertEq(handler.forgedLanded(), 0, "forged relay landed");
        assertEq(handler.replayLanded(), 0, "replayed relay landed");
    }
}
