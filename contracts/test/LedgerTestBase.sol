// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {SapoLedger} from "../src/SapoLedger.sol";
import {CheatTest} from "./Cheats.sol";

/// @dev Shared helpers: building inputs, signing them, and a sorted-pair Merkle tree.
abstract contract LedgerTestBase is CheatTest {
    function _input(uint64 round, bytes32 root, uint32 count) internal pure returns (SapoLedger.CommitmentInput memory c) {
        c.round = round;
        c.policyVersion = round;
        c.rolloutRoot = root;
        c.rolloutCount = count;
        c.producers = new address[](0);
        c.producerRounds = new uint64[](0);
        c.counts = new uint32[](0);
    }

    /// @dev `c` with one usage entry: `count` rollouts of `producer`'s round `producerRound`.
    function _usage1(SapoLedger.CommitmentInput memory c, address producer, uint64 producerRound, uint32 count)
        internal
        pure
        returns (SapoLedger.CommitmentInput memory)
    {
        address[] memory producers = new address[](1);
        producers[0] = producer;
        uint64[] memory rounds = new uint64[](1);
        rounds[0] = producerRound;
        uint32[] memory counts = new uint32[](1);
        counts[0] = count;
        return _withUsage(c, producers, rounds, counts);
    }

    /// @dev `c` with usage entries crediting each producer's round 1.
    function _withUsage(SapoLedger.CommitmentInput memory c, address[] memory producers, uint32[] memory counts)
        internal
        pure
        returns (SapoLedger.CommitmentInput memory)
    {
        uint64[] memory rounds = new uint64[](producers.length);
        for (uint256 i = 0; i < rounds.length; ++i) {
            rounds[i] = 1;
        }
        return _withUsage(c, producers, rounds, counts);
    }

    function _withUsage(
        SapoLedger.CommitmentInput memory c,
        address[] memory producers,
        uint64[] memory producerRounds,
        uint32[] memory counts
    ) internal pure returns (SapoLedger.CommitmentInput memory) {
        uint256 sum = 0;
        for (uint256 i = 0; i < counts.length; ++i) {
            sum += counts[i];
        }
        c.producers = producers;
        c.producerRounds = producerRounds;
        c.counts = counts;
        // forge-lint: disable-next-line(unsafe-typecast)
        c.externalCount = uint32(sum); // tests that overflow it want the contract's own refusal
        c.externalRoot = sum == 0 ? bytes32(0) : keccak256(abi.encode("external", c.round));
        return c;
    }

    function _sign(SapoLedger ledger, uint256 pk, address node, SapoLedger.CommitmentInput memory c, uint256 nonce)
        internal
        view
        returns (bytes memory)
    {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(pk, ledger.commitmentDigest(node, c, nonce));
        return abi.encodePacked(r, s, v);
    }

    function _hashPair(bytes32 a, bytes32 b) internal pure returns (bytes32) {
        return a < b ? keccak256(abi.encodePacked(a, b)) : keccak256(abi.encodePacked(b, a));
    }

    function _leaf(bytes32 rolloutHash) internal pure returns (bytes32) {
        return keccak256(abi.encodePacked(rolloutHash));
    }
}
