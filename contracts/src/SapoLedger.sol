// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {Nonces} from "@openzeppelin/contracts/utils/Nonces.sol";
import {ISapoLedgerErrors} from "./ISapoLedgerErrors.sol";
import {ISapoLedgerEvents} from "./ISapoLedgerEvents.sol";

/**
 * @title SapoLedger
 * @notice Verifiable participation for one SAPO swarm: each node commits, once per round, the
 * Merkle root of the rollouts it shared and the root of the external rollouts it trained on,
 * with per-producer usage counts, so anyone can audit contributions and prove that a given
 * rollout was committed.
 *
 * @dev Design (see docs/ledger.md and docs/security.md):
 * - Gas per commitment is constant in the number of rollouts: only roots and counts are stored.
 *   Per-producer usage is a short, capped, address-sorted list (one entry per *producer*, not per
 *   rollout); each entry adds to the producer's running credit and is emitted for indexers.
 * - Rounds strictly increase per node: a round can be committed at most once and never below the
 *   node's last committed round (no overwrite, no back-fill), and at most `MAX_ROUND_STEP` above it
 *   (so no node can commit round 2**64-1 and lock itself out of every later round).
 * - Credit rules: a usage entry `(producer, producerRound, count)` credits `producer` only if that
 *   producer committed `producerRound` with a non-zero rollout root, never the committing node
 *   itself, and the consumer's credit to one (producer, producerRound) summed over all its
 *   commitments never exceeds the rollout count that producer committed for that round. Credit
 *   therefore always names a round that exists, is bounded by what the producer shared, and cannot
 *   be minted for an address that shared nothing.
 * - No commitment waits on another node's: an entry whose producer round is already on chain is
 *   credited with the commitment; any other entry is stored as a *claim* of the consumer's round
 *   (`UsageClaimed`) and the commitment lands all the same. Anyone may later settle a claim
 *   (`settleCredit`) once the producer round is on chain, under the same credit rules; a claim on a
 *   round that never lands simply stays unsettled (no credit, nothing withdrawn from anyone). Counts are bounded by `MAX_ROLLOUTS_PER_ROUND`
 *   (the chain cannot count a Merkle tree's leaves from its root; this is the check it can make).
 *   What the rules cannot see (credit redirected to another producer that committed a round, a
 *   clique crediting its members' real or padded roots) is left to the audit's contribution score.
 * - A node may send a backlog of rounds as one `commitMany` transaction (a relayer, as one `commitManyBySig`
 *   carrying one signature per round): all land, in order, or none does.
 * - A commitment (or registration) is sent by the node itself or by any relayer carrying the
 *   node's EIP-712 signature; the signed struct includes a per-node nonce and the domain binds
 *   chain id and contract address, so a signature cannot be replayed.
 * - Merkle leaves are `keccak256(abi.encodePacked(rolloutHash))` (rollout hashes hashed once more)
 *   and internal nodes use OpenZeppelin's sorted-pair hashing, so a 64-byte internal node can never
 *   pass as a leaf.
 */
contract SapoLedger is EIP712, Nonces, ISapoLedgerErrors, ISapoLedgerEvents {
    /// @notice What a node submits for one round.
    struct CommitmentInput {
        uint64 round;
        uint64 policyVersion;
        bytes32 rolloutRoot;
        uint32 rolloutCount;
        bytes32 externalRoot;
        uint32 externalCount;
        address[] producers;
        uint64[] producerRounds;
        uint32[] counts;
    }

    /// @notice A claim: `consumer`'s round `round` used rollouts of `producer`'s round `producerRound`.
    struct ClaimKey {
        address consumer;
        uint64 round;
        address producer;
        uint64 producerRound;
    }

    /// @notice What the ledger keeps for one (node, round); `committedAt == 0` means "none".
    struct Commitment {
        bytes32 rolloutRoot;
        bytes32 externalRoot;
        uint64 policyVersion;
        uint32 rolloutCount;
        uint32 externalCount;
        uint64 committedAt;
        uint64 timestamp;
    }

    /// @notice Per-address running totals (credit may accrue to an address that never registered).
    struct NodeInfo {
        uint64 registeredAt;
        uint64 roundsCommitted;
        uint64 lastRound;
        uint64 rolloutsCommitted;
        uint64 externalUsed;
        uint64 creditReceived;
    }

    /// @notice Most usage entries (producer, producer round) one commitment may carry; bounds its gas.
    uint256 public constant MAX_PRODUCERS = 64;

    /// @notice Most rollouts (groups) one round may commit or use: a node's buffer holds at most 4096
    /// groups (sapo_async.limits.BUFFER_MAX_GROUPS), so an honest round never comes near it.
    uint32 public constant MAX_ROLLOUTS_PER_ROUND = 4096;

    /// @notice Most a node's round may jump above its last committed round (and the highest first
    /// round): 2**32 rounds leave 2**32 steps before 2**64-1, more than any node can ever commit.
    uint64 public constant MAX_ROUND_STEP = 2 ** 32;

    /// @notice Most commitments one `commitMany` (or claims one `settleCredits`) may carry; bounds its gas (64 rounds crediting 64 producers
    /// each would not fit a block; a node's backlog batch is at most sapo_async.limits.LEDGER_BATCH_DEPTH).
    uint256 public constant MAX_BATCH = 64;

    /// @notice EIP-712 type of a relayed commitment.
    bytes32 public constant COMMITMENT_TYPEHASH = keccak256(
        "Commitment(address node,uint64 round,uint64 policyVersion,bytes32 rolloutRoot,uint32 rolloutCount,"
        "bytes32 externalRoot,uint32 externalCount,address[] producers,uint64[] producerRounds,uint32[] counts,"
        "uint256 nonce)"
    );

    /// @notice EIP-712 type of a relayed registration.
    bytes32 public constant REGISTRATION_TYPEHASH =
        keccak256("Registration(address node,string metadata,uint256 nonce)");

    bytes32 private immutable _swarm;
    address[] private _nodes;
    mapping(address node => NodeInfo) private _info;
    mapping(address node => string) private _metadata;
    mapping(address node => mapping(uint64 round => Commitment)) private _commitments;
    mapping(address node => uint64[]) private _rounds;
    mapping(address consumer => mapping(address producer => mapping(uint64 round => uint32))) private _credited;
    mapping(bytes32 claimKey => uint32) private _claims;

    /**
     * @param swarm_ Identifier of the swarm this ledger serves (for example keccak256 of its name).
     */
    constructor(bytes32 swarm_) EIP712("SapoLedger", "1") {
        _swarm = swarm_;
    }

    // ------------------------------------------------------------------ registration

    /// @notice Registers `msg.sender` with `metadata` (for example a model id).
    function register(string calldata metadata) external {
        _register(msg.sender, metadata);
    }

    /**
     * @notice Registers `node` on its behalf, carrying the node's EIP-712 `Registration` signature.
     * @param nonce Must equal `nonces(node)`; consumed.
     */
    function registerBySig(address node, string calldata metadata, uint256 nonce, bytes calldata signature)
        external
    {
        bytes32 structHash = keccak256(abi.encode(REGISTRATION_TYPEHASH, node, keccak256(bytes(metadata)), nonce));
        _checkSigner(node, _hashTypedDataV4(structHash), signature);
        _useCheckedNonce(node, nonce);
        _register(node, metadata);
    }

    // ------------------------------------------------------------------ commitments

    /// @notice Records `msg.sender`'s commitment for `c.round`.
    function commit(CommitmentInput calldata c) external {
        _commit(msg.sender, c);
    }

    /**
     * @notice Records `msg.sender`'s commitments `cs` in order, atomically: each under every rule of `commit`
     * (the later ones seeing the earlier ones' rounds and credit), and one refused reverts them all, so no
     * round of a batch can land while an earlier one of it is refused.
     */
    function commitMany(CommitmentInput[] calldata cs) external {
        if (cs.length == 0 || cs.length > MAX_BATCH) revert SapoLedgerBatchLength(cs.length, MAX_BATCH);
        for (uint256 i = 0; i < cs.length; ++i) {
            _commit(msg.sender, cs[i]);
        }
    }

    /**
     * @notice Records `node`'s commitment, sent by any relayer with the node's EIP-712 signature.
     * @param nonce Must equal `nonces(node)`; consumed.
     */
    function commitBySig(address node, CommitmentInput calldata c, uint256 nonce, bytes calldata signature)
        external
    {
        _checkSigner(node, commitmentDigest(node, c, nonce), signature);
        _useCheckedNonce(node, nonce);
        _commit(node, c);
    }

    /**
     * @notice `commitBySig` of each of `cs` in order, atomically (as `commitMany`): `signatures[i]` is `node`'s
     * signature of `cs[i]` with nonce `nonce + i`, so a relayer lands a gasless node's backlog in one transaction.
     */
    function commitManyBySig(address node, CommitmentInput[] calldata cs, uint256 nonce, bytes[] calldata signatures)
        external
    {
        if (cs.length == 0 || cs.length > MAX_BATCH) revert SapoLedgerBatchLength(cs.length, MAX_BATCH);
        if (signatures.length != cs.length) revert SapoLedgerSignatureCount(signatures.length, cs.length);
        for (uint256 i = 0; i < cs.length; ++i) {
            _checkSigner(node, commitmentDigest(node, cs[i], nonce + i), signatures[i]);
            _useCheckedNonce(node, nonce + i);
            _commit(node, cs[i]);
        }
    }

    /**
     * @notice Credits `consumer`'s claim, made in its round `round`, on `producer`'s round `producerRound`,
     * now that the producer committed that round. Anyone may call it (the consumer, the producer, an auditor);
     * it applies the credit rules a commitment would have applied, emits `UsageCredited` and clears the claim.
     */
    function settleCredit(address consumer, uint64 round, address producer, uint64 producerRound) external {
        _settle(ClaimKey(consumer, round, producer, producerRound));
    }

    /// @notice `settleCredit` of each claim in order, atomically (one refused reverts them all), 1 to `MAX_BATCH`.
    function settleCredits(ClaimKey[] calldata claims) external {
        if (claims.length == 0 || claims.length > MAX_BATCH) revert SapoLedgerBatchLength(claims.length, MAX_BATCH);
        for (uint256 i = 0; i < claims.length; ++i) {
            _settle(claims[i]);
        }
    }

    // ------------------------------------------------------------------ views

    /// @notice Identifier of the swarm this ledger serves.
    function swarm() external view returns (bytes32) {
        return _swarm;
    }

    /// @notice Number of registered nodes.
    function nodeCount() external view returns (uint256) {
        return _nodes.length;
    }

    /// @notice Registered nodes `[offset, offset + limit)` in registration order (clipped).
    function nodes(uint256 offset, uint256 limit) external view returns (address[] memory page) {
        (uint256 start, uint256 end) = _clip(offset, limit, _nodes.length);
        page = new address[](end - start);
        for (uint256 i = start; i < end; ++i) {
            page[i - start] = _nodes[i];
        }
    }

    /// @notice Whether `node` is registered.
    function isRegistered(address node) public view returns (bool) {
        return _info[node].registeredAt != 0;
    }

    /// @notice Running totals of `node` (all zero for an unknown address).
    function nodeInfo(address node) external view returns (NodeInfo memory) {
        return _info[node];
    }

    /// @notice Metadata `node` registered with.
    function metadataOf(address node) external view returns (string memory) {
        return _metadata[node];
    }

    /// @notice Rollouts of `producer` that other nodes reported training on.
    function creditReceived(address producer) external view returns (uint64) {
        return _info[producer].creditReceived;
    }

    /// @notice Rollouts of `producer`'s round `producerRound` that `consumer` has credited so far.
    function creditedBy(address consumer, address producer, uint64 producerRound) external view returns (uint32) {
        return _credited[consumer][producer][producerRound];
    }

    /// @notice Unsettled rollouts `consumer` claimed in its round `round` on `producer`'s round `producerRound`.
    function claimOf(address consumer, uint64 round, address producer, uint64 producerRound)
        external
        view
        returns (uint32)
    {
        return _claims[_claimKey(consumer, round, producer, producerRound)];
    }

    /// @notice The commitment of `node` for `round`; `committedAt == 0` when there is none.
    function commitmentOf(address node, uint64 round) external view returns (Commitment memory) {
        return _commitments[node][round];
    }

    /// @notice Number of rounds `node` committed.
    function roundCount(address node) external view returns (uint256) {
        return _rounds[node].length;
    }

    /// @notice Rounds `node` committed, ascending, `[offset, offset + limit)` (clipped).
    function roundsOf(address node, uint256 offset, uint256 limit) external view returns (uint64[] memory page) {
        uint64[] storage all = _rounds[node];
        (uint256 start, uint256 end) = _clip(offset, limit, all.length);
        page = new uint64[](end - start);
        for (uint256 i = start; i < end; ++i) {
            page[i - start] = all[i];
        }
    }

    /// @notice Whether `rolloutHash` is among the rollouts `node` committed for `round`.
    function isRolloutIncluded(address node, uint64 round, bytes32 rolloutHash, bytes32[] calldata proof)
        external
        view
        returns (bool)
    {
        Commitment storage c = _commitments[node][round];
        return c.committedAt != 0 && c.rolloutCount != 0
            && MerkleProof.verifyCalldata(proof, c.rolloutRoot, leafOf(rolloutHash));
    }

    /// @notice Whether `rolloutHash` is among the external rollouts `node` trained on in `round`.
    function isExternalIncluded(address node, uint64 round, bytes32 rolloutHash, bytes32[] calldata proof)
        external
        view
        returns (bool)
    {
        Commitment storage c = _commitments[node][round];
        return c.committedAt != 0 && c.externalCount != 0
            && MerkleProof.verifyCalldata(proof, c.externalRoot, leafOf(rolloutHash));
    }

    /// @notice Merkle leaf of a rollout hash: `keccak256(abi.encodePacked(rolloutHash))`.
    function leafOf(bytes32 rolloutHash) public pure returns (bytes32) {
        return keccak256(abi.encodePacked(rolloutHash));
    }

    /// @notice EIP-712 digest `node` signs to have `c` relayed with `nonce`.
    function commitmentDigest(address node, CommitmentInput calldata c, uint256 nonce)
        public
        view
        returns (bytes32)
    {
        bytes32 structHash = keccak256(
            abi.encode(
                COMMITMENT_TYPEHASH,
                node,
                c.round,
                c.policyVersion,
                c.rolloutRoot,
                c.rolloutCount,
                c.externalRoot,
                c.externalCount,
                keccak256(abi.encodePacked(c.producers)),
                keccak256(abi.encodePacked(c.producerRounds)),
                keccak256(abi.encodePacked(c.counts)),
                nonce
            )
        );
        return _hashTypedDataV4(structHash);
    }

    // ------------------------------------------------------------------ internals

    function _register(address node, string calldata metadata) private {
        NodeInfo storage info = _info[node];
        if (info.registeredAt != 0) revert SapoLedgerAlreadyRegistered(node);
        info.registeredAt = uint64(block.number);
        _metadata[node] = metadata;
        _nodes.push(node);
        emit NodeRegistered(node, metadata);
    }

    function _commit(address node, CommitmentInput calldata c) private {
        NodeInfo storage info = _info[node];
        if (info.registeredAt == 0) revert SapoLedgerNotRegistered(node);
        // Compared with the last round rather than a "next round" counter, so round 2**64-1 cannot overflow.
        if (info.roundsCommitted != 0 && c.round <= info.lastRound) {
            revert SapoLedgerRoundNotIncreasing(node, c.round, info.lastRound);
        }
        // The first round is at most 2**32 and each adds at most 2**32: overflowing needs 2**32 - 1 commitments.
        uint64 maxRound = info.roundsCommitted == 0 ? MAX_ROUND_STEP : info.lastRound + MAX_ROUND_STEP;
        if (c.round > maxRound) revert SapoLedgerRoundTooFar(node, c.round, maxRound);
        if (c.rolloutCount > MAX_ROLLOUTS_PER_ROUND) {
            revert SapoLedgerCountTooLarge(c.rolloutCount, MAX_ROLLOUTS_PER_ROUND);
        }
        if (c.externalCount > MAX_ROLLOUTS_PER_ROUND) {
            revert SapoLedgerCountTooLarge(c.externalCount, MAX_ROLLOUTS_PER_ROUND);
        }
        if ((c.rolloutRoot == bytes32(0)) != (c.rolloutCount == 0)) {
            revert SapoLedgerRootCountMismatch(c.rolloutRoot, c.rolloutCount);
        }
        if ((c.externalRoot == bytes32(0)) != (c.externalCount == 0)) {
            revert SapoLedgerRootCountMismatch(c.externalRoot, c.externalCount);
        }
        _checkUsage(node, c);

        // `lastRound` only ever grows, so `_commitments[node][c.round]` is empty here: never overwritten.
        _commitments[node][c.round] = Commitment({
            rolloutRoot: c.rolloutRoot,
            externalRoot: c.externalRoot,
            policyVersion: c.policyVersion,
            rolloutCount: c.rolloutCount,
            externalCount: c.externalCount,
            committedAt: uint64(block.number),
            timestamp: uint64(block.timestamp)
        });
        _rounds[node].push(c.round);
        info.lastRound = c.round;
        info.roundsCommitted += 1;
        info.rolloutsCommitted += c.rolloutCount;
        info.externalUsed += c.externalCount;
        emit CommitmentRecorded(
            node,
            c.round,
            c.policyVersion,
            c.rolloutRoot,
            c.rolloutCount,
            c.externalRoot,
            c.externalCount,
            msg.sender
        );
        for (uint256 i = 0; i < c.producers.length; ++i) {
            _credit(node, c.round, c.producers[i], c.producerRounds[i], c.counts[i]);
        }
    }

    /// @dev One usage entry of a commitment (entries are sorted, so each (producer, round) appears once):
    /// credited now if the producer round is on chain, else kept as a claim for `settleCredit`.
    function _credit(address consumer, uint64 round, address producer, uint64 producerRound, uint32 count) private {
        if (_commitments[producer][producerRound].committedAt == 0) {
            _claims[_claimKey(consumer, round, producer, producerRound)] = count;
            emit UsageClaimed(producer, consumer, round, producerRound, count);
            return;
        }
        _creditNow(consumer, round, producer, producerRound, count);
    }

    function _settle(ClaimKey memory k) private {
        bytes32 key = _claimKey(k.consumer, k.round, k.producer, k.producerRound);
        uint32 count = _claims[key];
        if (count == 0) revert SapoLedgerNothingToSettle(k.consumer, k.round, k.producer, k.producerRound);
        delete _claims[key];
        _creditNow(k.consumer, k.round, k.producer, k.producerRound, count);
    }

    /// @dev The credit rules: the producer round holds rollouts and this consumer's credit stays within them.
    function _creditNow(address consumer, uint64 round, address producer, uint64 producerRound, uint32 count)
        private
    {
        Commitment storage shared = _commitments[producer][producerRound];
        if (shared.committedAt == 0 || shared.rolloutCount == 0) {
            revert SapoLedgerProducerRoundNotCommitted(producer, producerRound);
        }
        uint256 credited = uint256(_credited[consumer][producer][producerRound]) + count;
        if (credited > shared.rolloutCount) {
            revert SapoLedgerCreditExceedsShared(producer, producerRound, credited, shared.rolloutCount);
        }
        // casting to 'uint32' is safe because credited <= rolloutCount <= MAX_ROLLOUTS_PER_ROUND
        // forge-lint: disable-next-line(unsafe-typecast)
        _credited[consumer][producer][producerRound] = uint32(credited);
        _info[producer].creditReceived += count;
        emit UsageCredited(producer, consumer, round, producerRound, count);
    }

    /// @dev One slot per claim, keyed by the whole (consumer, round, producer, producer round).
    function _claimKey(address consumer, uint64 round, address producer, uint64 producerRound)
        private
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(consumer, round, producer, producerRound));
    }

    function _checkUsage(address node, CommitmentInput calldata c) private pure {
        uint256 n = c.producers.length;
        if (n != c.counts.length || n != c.producerRounds.length) {
            revert SapoLedgerUsageLengthMismatch(n, c.producerRounds.length, c.counts.length);
        }
        if (n > MAX_PRODUCERS) revert SapoLedgerTooManyProducers(n, MAX_PRODUCERS);
        address previous = address(0);
        uint64 previousRound = 0;
        uint256 sum = 0;
        for (uint256 i = 0; i < n; ++i) {
            address producer = c.producers[i];
            uint64 producerRound = c.producerRounds[i];
            // Strictly ascending by (producer, producerRound): a producer may appear once per round it shared.
            if (
                producer == address(0) || producer < previous
                    || (i != 0 && producer == previous && producerRound <= previousRound)
            ) revert SapoLedgerProducersNotSorted(previous, producer);
            if (producer == node) revert SapoLedgerSelfUsage(node);
            if (c.counts[i] == 0) revert SapoLedgerZeroUsage(producer);
            sum += c.counts[i];
            previous = producer;
            previousRound = producerRound;
        }
        if (sum != c.externalCount) revert SapoLedgerUsageSumMismatch(sum, c.externalCount);
    }

    function _checkSigner(address node, bytes32 digest, bytes calldata signature) private pure {
        address signer = ECDSA.recover(digest, signature);
        if (signer != node) revert SapoLedgerInvalidSigner(signer, node);
    }

    function _clip(uint256 offset, uint256 limit, uint256 length) private pure returns (uint256 start, uint256 end) {
        start = offset > length ? length : offset;
        end = limit > length - start ? length : start + limit;
    }
}
