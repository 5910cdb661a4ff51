// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/**
 * @title NaiveLedger
 * @notice Benchmark baseline only: records every rollout hash of a round in its own storage slot,
 * the design SapoLedger avoids. Its gas grows linearly with the number of rollouts.
 */
contract NaiveLedger {
    mapping(address node => mapping(uint64 round => bytes32[])) private _rollouts;

    /// @notice A node recorded `count` rollout hashes for `round`.
    event RolloutsRecorded(address indexed node, uint64 indexed round, uint256 count);

    /// @notice Stores each of `rolloutHashes` for `msg.sender`'s `round`.
    function record(uint64 round, bytes32[] calldata rolloutHashes) external {
        bytes32[] storage slots = _rollouts[msg.sender][round];
        for (uint256 i = 0; i < rolloutHashes.length; ++i) {
            slots.push(rolloutHashes[i]);
        }
        emit RolloutsRecorded(msg.sender, round, rolloutHashes.length);
    }

    /// @notice Number of rollout hashes `node` recorded for `round`.
    function countOf(address node, uint64 round) external view returns (uint256) {
        return _rollouts[node][round].length;
    }
}
