// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/**
 * @title ISapoLedgerErrors
 * @notice The custom errors of `SapoLedger`, each carrying the offending values. Kept apart so the
 * contract stays one screen of rules; the contract inherits them, so its ABI lists them all.
 */
interface ISapoLedgerErrors {
    /// @notice `node` is not registered.
    error SapoLedgerNotRegistered(address node);
    /// @notice `node` is already registered.
    error SapoLedgerAlreadyRegistered(address node);
    /// @notice `round` is not above `lastRound`, the node's last committed round.
    error SapoLedgerRoundNotIncreasing(address node, uint64 round, uint64 lastRound);
    /// @notice The signature was made by `signer`, not by `node`.
    error SapoLedgerInvalidSigner(address signer, address node);
    /// @notice A root is zero while its count is not, or the other way round.
    error SapoLedgerRootCountMismatch(bytes32 root, uint32 count);
    /// @notice `round` is more than `MAX_ROUND_STEP` above the node's last round (`maxRound` is the highest allowed).
    error SapoLedgerRoundTooFar(address node, uint64 round, uint64 maxRound);
    /// @notice A rollout or external count above `MAX_ROLLOUTS_PER_ROUND`.
    error SapoLedgerCountTooLarge(uint32 count, uint32 max);
    /// @notice `producers`, `producerRounds` and `counts` differ in length.
    error SapoLedgerUsageLengthMismatch(uint256 producers, uint256 producerRounds, uint256 counts);
    /// @notice More producers than `MAX_PRODUCERS`.
    error SapoLedgerTooManyProducers(uint256 producers, uint256 max);
    /// @notice Entries must be strictly ascending by (producer, producer round): sorted, no duplicates, none zero.
    error SapoLedgerProducersNotSorted(address previous, address producer);
    /// @notice A node cannot credit itself.
    error SapoLedgerSelfUsage(address node);
    /// @notice A usage entry of zero rollouts.
    error SapoLedgerZeroUsage(address producer);
    /// @notice The per-producer counts do not add up to `externalCount`.
    error SapoLedgerUsageSumMismatch(uint256 sum, uint32 externalCount);
    /// @notice `producer` has no commitment with rollouts for `producerRound`: there is nothing to credit.
    error SapoLedgerProducerRoundNotCommitted(address producer, uint64 producerRound);
    /// @notice Crediting would bring this consumer's credit for (`producer`, `producerRound`) to `credited`,
    /// above the `shared` rollouts the producer committed for that round.
    error SapoLedgerCreditExceedsShared(address producer, uint64 producerRound, uint256 credited, uint32 shared);
    /// @notice `consumer`'s round `round` holds no unsettled claim on (`producer`, `producerRound`).
    error SapoLedgerNothingToSettle(address consumer, uint64 round, address producer, uint64 producerRound);
    /// @notice A `commitMany` batch of `length` commitments: it must hold 1 to `max`.
    error SapoLedgerBatchLength(uint256 length, uint256 max);
    /// @notice A `commitManyBySig` batch of `commitments` commitments carried `signatures` signatures: one each.
    error SapoLedgerSignatureCount(uint256 signatures, uint256 commitments);
}
