// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/**
 * @title ISapoLedgerEvents
 * @notice The events of `SapoLedger` (what indexers and the explorer read). Kept apart, as the errors are, so the
 * contract stays one screen of rules; the contract inherits them, so its ABI lists them all.
 */
interface ISapoLedgerEvents {
    /// @notice A node registered (or was registered by a relayer) with its metadata.
    event NodeRegistered(address indexed node, string metadata);

    /// @notice A node's commitment for `round` was recorded.
    event CommitmentRecorded(
        address indexed node,
        uint64 indexed round,
        uint64 policyVersion,
        bytes32 rolloutRoot,
        uint32 rolloutCount,
        bytes32 externalRoot,
        uint32 externalCount,
        address relayer
    );

    /// @notice `consumer` trained, in its round `round`, on `count` rollouts `producer` committed
    /// in its round `producerRound`.
    event UsageCredited(
        address indexed producer, address indexed consumer, uint64 indexed round, uint64 producerRound, uint32 count
    );

    /// @notice `consumer`, in its round `round`, reported training on `count` rollouts of `producer`'s round
    /// `producerRound`, which is not on chain yet: credit waits for `settleCredit`.
    event UsageClaimed(
        address indexed producer, address indexed consumer, uint64 indexed round, uint64 producerRound, uint32 count
    );
}
