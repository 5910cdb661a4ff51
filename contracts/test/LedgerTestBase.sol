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
        c.counts = new uint32[](0);
    }

    function _withUsage(SapoLedger.CommitmentInput memory c, address[] memory producers, uint32[] memory counts)
        internal
        pure
        returns (SapoLedger.CommitmentInput memory)
    {
        uint32 sum = 0;
        for (uint256 i = 0; i < counts.length; ++i) {
            sum += counts[i];
        }
        c.producers = producers;
        c.counts = counts;
        c.externalCount = sum;
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
