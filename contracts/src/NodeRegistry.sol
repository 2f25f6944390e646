// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MessageHashUtils} from "@openzeppelin/contracts/utils/cryptography/MessageHashUtils.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {Checkpoints} from "@openzeppelin/contracts/utils/structs/Checkpoints.sol";

/// @title NodeRegistry
/// @notice Identity and stake of every rollnet participant. Binds an Ethereum address to a libp2p peer ID
///         whose key holder signed the binding, holds the stake that jobs may lock as lease collateral and
///         slash, and keeps the history of every validator's weight so committees are drawn from stake
///         fixed before their randomness is known.
/// @dev Invariants: address(this).balance == totalActive + totalLocked + totalUnbonding. Only jobs created by
///      the registered factory may lock, release or slash; slashed wei go only to the calling job, never to a
///      third party. Locked collateral cannot be unbonded; a slash reaches active, then unbonding, then locked
///      stake (so nobody shields stake from a slash by locking it as collateral), and a job releasing a lease's
///      collateral gets whatever of it is left. A peer ID is registered only with a signature by
///      its own secp256k1 key over (chain id, this registry, the registering address).
///      Validator weight = active + locked stake of a node holding the validator role with at least the
///      validator minimum, else 0; its history (and the total's) is checkpointed per block. An address holds
///      one staked role, worker or validator, never both: a worker's stake is lease collateral only, and a
///      validator's backs its votes only, so no slash in one job can reach another job's collateral through
///      a shared stake, and no voter can hide its stake in collateral.
contract NodeRegistry {
    using Checkpoints for Checkpoints.Trace208;

    /// @notice Role bit for rollout workers.
    uint8 public constant ROLE_WORKER = 1;
    /// @notice Role bit for validators.
    uint8 public constant ROLE_VALIDATOR = 2;
    /// @notice Role bit for a job's trainer: a registered peer identity that needs no stake and carries none.
    uint8 public constant ROLE_TRAINER = 4;
    uint8 internal constant ALL_ROLES = ROLE_WORKER | ROLE_VALIDATOR | ROLE_TRAINER;
    uint8 internal constant STAKED_ROLES = ROLE_WORKER | ROLE_VALIDATOR;

    /// @notice Domain tag of the peer-binding message the libp2p key signs.
    bytes32 public constant PEER_BINDING_TAG = keccak256("rollnet/peer-binding/v1");
    /// @notice Longest accepted `listenAddrs` value, in bytes.
    uint256 public constant MAX_ADDRS_LENGTH = 512;

    uint256 internal constant SECP256K1_P = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEFFFFFC2F;
    /// @dev A libp2p peer ID of a secp256k1 key: identity multihash (0x00, 37 bytes) of the protobuf
    ///      PublicKey {Type: Secp256k1 (2), Data: 33-byte compressed point}.
    bytes6 internal constant SECP256K1_PEER_PREFIX = 0x002508021221;
    uint256 internal constant SECP256K1_PEER_LENGTH = 39;

    struct Node {
        uint128 active; // free stake
        uint128 locked; // collateral of open leases
        uint128 unbonding;
        uint64 unbondReadyAt;
        uint8 roles;
        bytes peerId;
    }

    /// @notice Minimum active stake for the worker role, in wei.
    uint256 public immutable minWorkerStake;
    /// @notice Minimum active stake for the validator role, in wei.
    uint256 public immutable minValidatorStake;
    /// @notice Seconds between an unbond request and the earliest withdrawal.
    uint64 public immutable unbondingPeriod;
    /// @notice The account allowed to set the factory, once.
    address public immutable deployer;
    /// @notice The job factory whose jobs may lock and slash; set once.
    address public factory;

    uint256 public totalActive;
    uint256 public totalLocked;
    uint256 public totalUnbonding;

    mapping(address => Node) internal nodes;
    /// @notice keccak256(peerId) => the address that registered it.
    mapping(bytes32 => address) public peerOwner;
    /// @notice Where a node listens: newline-separated multiaddrs without the /p2p/ suffix (the registered
    ///         peer ID is appended by dialers, so a dial authenticates the registered identity).
    mapping(address => bytes) public listenAddrs;

    mapping(address => Checkpoints.Trace208) internal weightHistory;
    Checkpoints.Trace208 internal totalWeightHistory;

    error InvalidRoles(uint8 roles);
    error UnsupportedPeerId();
    error PeerSignatureInvalid();
    error PeerIdTaken(address owner);
    error AlreadyRegistered(address node);
    error NotRegistered(address node);
    error StakeBelowMinimum(uint256 minimum, uint256 provided);
    error ZeroAmount();
    error InsufficientActiveStake(uint256 requested, uint256 active);
    error InsufficientLockedStake(uint256 requested, uint256 locked);
    error NotActive(address node, uint8 role);
    error NothingToWithdraw();
    error UnbondingNotFinished(uint64 readyAt);
    error NotDeployer();
    error FactoryAlreadySet();
    error NotAuthorizedSlasher(address caller);
    error ZeroAddress();
    error AddrsTooLong(uint256 length, uint256 maximum);
    error FutureLookup(uint256 blockNumber);

    event NodeJoined(address indexed node, bytes peerId, uint8 roles, uint256 stake);
    event PeerIdChanged(address indexed node, bytes peerId);
    event StakeAdded(address indexed node, uint256 amount, uint256 active);
    event UnbondRequested(address indexed node, uint256 amount, uint64 readyAt);
    event Withdrawn(address indexed node, uint256 amount);
    event CollateralLocked(address indexed node, address indexed job, uint256 amount);
    event CollateralReleased(address indexed node, address indexed job, uint256 amount, uint256 taken, bytes32 reason);
    event Slashed(address indexed node, address indexed job, uint256 amount, bytes32 reason);
    event ValidatorWeightChanged(address indexed node, uint256 weight, uint256 total);
    event FactorySet(address factory);
    event AddrsSet(address indexed node, bytes addrs);

    /// @param minWorkerStake_ Minimum stake (wei) for the worker role.
    /// @param minValidatorStake_ Minimum stake (wei) for the validator role.
    /// @param unbondingPeriod_ Seconds an unbond request waits before withdrawal.
    constructor(uint256 minWorkerStake_, uint256 minValidatorStake_, uint64 unbondingPeriod_) {
        minWorkerStake = minWorkerStake_;
        minValidatorStake = minValidatorStake_;
        unbondingPeriod = unbondingPeriod_;
        deployer = msg.sender;
    }

    modifier onlyJob() {
        address f = factory;
        if (f == address(0) || !IJobRegistryView(f).isJob(msg.sender)) revert NotAuthorizedSlasher(msg.sender);
        _;
    }

    /// @notice Set the factory whose jobs may lock and slash. Callable once, by the deployer.
    /// @param factory_ The JobFactory address.
    function setFactory(address factory_) external {
        if (msg.sender != deployer) revert NotDeployer();
        if (factory != address(0)) revert FactoryAlreadySet();
        if (factory_ == address(0)) revert ZeroAddress();
        factory = factory_;
        emit FactorySet(factory_);
    }

    // ------------------------------------------------------------------ identity

    /// @notice Register the caller with a libp2p peer ID and roles, staking msg.value.
    /// @param peerId The libp2p peer ID bytes of a secp256k1 key (identity multihash, 39 bytes).
    /// @param peerSig That key's 65-byte signature of `peerBindingHash(msg.sender)` (EIP-191 personal message).
    /// @param roles Bitmask of ROLE_WORKER, ROLE_VALIDATOR and ROLE_TRAINER; worker and validator exclude each other.
    function join(bytes calldata peerId, bytes calldata peerSig, uint8 roles) external payable {
        if (roles == 0 || roles & ~ALL_ROLES != 0 || roles & STAKED_ROLES == STAKED_ROLES) revert InvalidRoles(roles);
        Node storage n = nodes[msg.sender];
        if (n.roles != 0) revert AlreadyRegistered(msg.sender);
        uint256 minimum = minStakeFor(roles);
        if (msg.value < minimum) revert StakeBelowMinimum(minimum, msg.value);
        _bindPeer(n, peerId, peerSig);

        n.roles = roles;
        n.active = SafeCast.toUint128(msg.value);
        totalActive += msg.value;
        emit NodeJoined(msg.sender, peerId, roles, msg.value);
        _syncWeight(msg.sender, n);
    }

    /// @notice Rebind the caller's address to a new libp2p peer ID (key rotation), proven like at `join`.
    /// @param peerId The new peer ID bytes.
    /// @param peerSig The new key's signature of `peerBindingHash(msg.sender)`.
    function setPeerId(bytes calldata peerId, bytes calldata peerSig) external {
        Node storage n = nodes[msg.sender];
        if (n.roles == 0) revert NotRegistered(msg.sender);
        bytes32 old = keccak256(n.peerId);
        _bindPeer(n, peerId, peerSig);
        delete peerOwner[old];
        emit PeerIdChanged(msg.sender, peerId);
    }

    /// @notice The hash a libp2p key signs (as an EIP-191 personal message) to bind itself to `node`.
    /// @param node The address the peer ID is bound to.
    /// @return keccak256(abi.encode(PEER_BINDING_TAG, chain id, this registry, node)).
    function peerBindingHash(address node) public view returns (bytes32) {
        return keccak256(abi.encode(PEER_BINDING_TAG, block.chainid, address(this), node));
    }

    /// @notice The Ethereum-style address of the secp256k1 key inside a libp2p peer ID (reverts if the
    ///         peer ID is not a secp256k1 identity multihash or its point is not on the curve).
    /// @param peerId The peer ID bytes.
    /// @return The address keccak256(x || y)[12:] of the key.
    function peerKeyAddress(bytes calldata peerId) public view returns (address) {
        if (peerId.length != SECP256K1_PEER_LENGTH || bytes6(peerId[0:6]) != SECP256K1_PEER_PREFIX) {
            revert UnsupportedPeerId();
        }
        uint8 prefix = uint8(peerId[6]);
        uint256 x = uint256(bytes32(peerId[7:39]));
        if ((prefix != 2 && prefix != 3) || x >= SECP256K1_P) revert UnsupportedPeerId();
        uint256 rhs = addmod(mulmod(mulmod(x, x, SECP256K1_P), x, SECP256K1_P), 7, SECP256K1_P);
        uint256 y = _modExp(rhs, (SECP256K1_P + 1) / 4, SECP256K1_P); // p = 3 (mod 4): the square root
        if (mulmod(y, y, SECP256K1_P) != rhs) revert UnsupportedPeerId();
        if (y & 1 != prefix & 1) y = SECP256K1_P - y;
        return address(uint160(uint256(keccak256(abi.encodePacked(x, y)))));
    }

    /// @notice Publish where the caller's libp2p host listens, for peers bootstrapping from the registry.
    /// @param addrs Newline-separated multiaddrs without /p2p/ (empty to withdraw them).
    function setAddrs(bytes calldata addrs) external {
        if (nodes[msg.sender].roles == 0) revert NotRegistered(msg.sender);
        if (addrs.length > MAX_ADDRS_LENGTH) revert AddrsTooLong(addrs.length, MAX_ADDRS_LENGTH);
        listenAddrs[msg.sender] = addrs;
        emit AddrsSet(msg.sender, addrs);
    }

    // ------------------------------------------------------------------ stake

    /// @notice Add msg.value to the caller's active stake.
    function addStake() external payable {
        Node storage n = nodes[msg.sender];
        if (n.roles == 0) revert NotRegistered(msg.sender);
        if (msg.value == 0) revert ZeroAmount();
        n.active += SafeCast.toUint128(msg.value);
        totalActive += msg.value;
        emit StakeAdded(msg.sender, msg.value, n.active);
        _syncWeight(msg.sender, n);
    }

    /// @notice Move `amount` of free active stake into unbonding; the whole unbonding balance becomes
    ///         withdrawable `unbondingPeriod` seconds after the latest request. Locked collateral cannot move.
    /// @param amount Wei to unbond.
    function requestUnbond(uint256 amount) external {
        Node storage n = nodes[msg.sender];
        if (n.roles == 0) revert NotRegistered(msg.sender);
        if (amount == 0) revert ZeroAmount();
        if (amount > n.active) revert InsufficientActiveStake(amount, n.active);
        n.active -= uint128(amount);
        n.unbonding += uint128(amount);
        totalActive -= amount;
        totalUnbonding += amount;
        uint64 readyAt = uint64(block.timestamp) + unbondingPeriod;
        n.unbondReadyAt = readyAt;
        emit UnbondRequested(msg.sender, amount, readyAt);
        _syncWeight(msg.sender, n);
    }

    /// @notice Withdraw all unbonding stake once the unbonding period has passed (the caller pulls its own wei).
    function withdraw() external {
        Node storage n = nodes[msg.sender];
        uint256 amount = n.unbonding;
        if (amount == 0) revert NothingToWithdraw();
        if (block.timestamp < n.unbondReadyAt) revert UnbondingNotFinished(n.unbondReadyAt);
        n.unbonding = 0;
        totalUnbonding -= amount;
        emit Withdrawn(msg.sender, amount);
        Address.sendValue(payable(msg.sender), amount);
    }

    // ------------------------------------------------------------------ jobs: collateral and slashing

    /// @notice Lock `amount` of an active worker's free stake as one lease's collateral. Jobs only.
    /// @param node The worker.
    /// @param amount Wei to lock.
    function lockCollateral(address node, uint256 amount) external onlyJob {
        Node storage n = nodes[node];
        if (n.roles & ROLE_WORKER == 0 || uint256(n.active) + n.locked < minWorkerStake) {
            revert NotActive(node, ROLE_WORKER);
        }
        if (amount > n.active) revert InsufficientActiveStake(amount, n.active);
        n.active -= uint128(amount);
        n.locked += uint128(amount);
        totalActive -= amount;
        totalLocked += amount;
        emit CollateralLocked(node, msg.sender, amount);
    }

    /// @notice Release `amount` of a node's locked collateral, taking `taken` of it for the calling job
    ///         (sent to it) and returning the rest to the node's active stake. Jobs only. If slashes have
    ///         already reached the node's locked stake, only what is left is released and taken from.
    /// @param node The worker.
    /// @param amount Wei of collateral released.
    /// @param taken Wei of it slashed (at most `amount`).
    /// @param reason A short machine-readable reason.
    /// @return got The wei actually taken.
    function releaseCollateral(address node, uint256 amount, uint256 taken, bytes32 reason)
        external
        onlyJob
        returns (uint256 got)
    {
        if (taken > amount) revert InsufficientLockedStake(taken, amount);
        Node storage n = nodes[node];
        uint256 released = amount < n.locked ? amount : n.locked;
        got = taken < released ? taken : released;
        n.locked -= uint128(released);
        n.active += uint128(released - got);
        totalLocked -= released;
        totalActive += released - got;
        emit CollateralReleased(node, msg.sender, released, got, reason);
        if (got > 0) {
            _syncWeight(node, n);
            Address.sendValue(payable(msg.sender), got);
        }
    }

    /// @notice Slash up to `amount` from `node`, active stake first, then unbonding, then locked stake, and
    ///         send it to the calling job. Jobs only.
    /// @param node The address to slash.
    /// @param amount Wei to take (capped at what the node holds).
    /// @param reason A short machine-readable reason.
    /// @return taken The wei actually slashed.
    function slash(address node, uint256 amount, bytes32 reason) external onlyJob returns (uint256 taken) {
        Node storage n = nodes[node];
        uint256 fromActive = amount < n.active ? amount : n.active;
        uint256 rest = amount - fromActive;
        uint256 fromUnbonding = rest < n.unbonding ? rest : n.unbonding;
        rest -= fromUnbonding;
        uint256 fromLocked = rest < n.locked ? rest : n.locked;
        n.active -= uint128(fromActive);
        n.unbonding -= uint128(fromUnbonding);
        n.locked -= uint128(fromLocked);
        totalActive -= fromActive;
        totalUnbonding -= fromUnbonding;
        totalLocked -= fromLocked;
        taken = fromActive + fromUnbonding + fromLocked;
        emit Slashed(node, msg.sender, taken, reason);
        if (taken > 0) {
            _syncWeight(node, n);
            Address.sendValue(payable(msg.sender), taken);
        }
    }

    // ------------------------------------------------------------------ views

    /// @notice The minimum stake for a role bitmask (the largest minimum among its roles).
    /// @param roles Bitmask of roles.
    /// @return The minimum stake in wei.
    function minStakeFor(uint8 roles) public view returns (uint256) {
        uint256 m = 0;
        if (roles & ROLE_WORKER != 0 && minWorkerStake > m) m = minWorkerStake;
        if (roles & ROLE_VALIDATOR != 0 && minValidatorStake > m) m = minValidatorStake;
        return m;
    }

    /// @notice Whether `node` holds `role` with at least that role's minimum bonded (active + locked) stake.
    /// @param node The address to check.
    /// @param role A single role bit.
    /// @return True when the node may act in that role now.
    function isActive(address node, uint8 role) external view returns (bool) {
        Node storage n = nodes[node];
        return n.roles & role != 0 && uint256(n.active) + n.locked >= minStakeFor(role);
    }

    /// @notice A node's registration.
    /// @param node The address.
    /// @return peerId The bound libp2p peer ID.
    /// @return roles The role bitmask (0 if not registered).
    /// @return active Free active stake in wei.
    /// @return locked Stake locked as lease collateral.
    /// @return unbonding Unbonding stake in wei.
    /// @return unbondReadyAt When unbonding stake becomes withdrawable.
    function nodeInfo(address node)
        external
        view
        returns (
            bytes memory peerId,
            uint8 roles,
            uint256 active,
            uint256 locked,
            uint256 unbonding,
            uint64 unbondReadyAt
        )
    {
        Node storage n = nodes[node];
        return (n.peerId, n.roles, n.active, n.locked, n.unbonding, n.unbondReadyAt);
    }

    /// @notice The address a libp2p peer ID is registered to (zero if none).
    /// @param peerId The peer ID bytes.
    /// @return The owning address.
    function ownerOfPeer(bytes calldata peerId) external view returns (address) {
        return peerOwner[keccak256(peerId)];
    }

    /// @notice A node's current validator weight and the total over all validators.
    /// @param node The address.
    /// @return weight The node's weight now.
    /// @return total The sum of all validators' weights now.
    function currentWeights(address node) external view returns (uint256 weight, uint256 total) {
        return (weightHistory[node].latest(), totalWeightHistory.latest());
    }

    /// @notice A node's validator weight and the total at the end of a past block.
    /// @param node The address.
    /// @param blockNumber A block before the current one.
    /// @return weight The node's weight then.
    /// @return total The sum of all validators' weights then.
    function weightsAt(address node, uint256 blockNumber) external view returns (uint256 weight, uint256 total) {
        uint48 key = _pastKey(blockNumber);
        return (weightHistory[node].upperLookupRecent(key), totalWeightHistory.upperLookupRecent(key));
    }

    /// @notice A node's validator weight at the end of a past block.
    /// @param node The address.
    /// @param blockNumber A block before the current one.
    /// @return The node's weight then.
    function weightAt(address node, uint256 blockNumber) external view returns (uint256) {
        return weightHistory[node].upperLookupRecent(_pastKey(blockNumber));
    }

    /// @notice The sum of all validators' weights at the end of a past block.
    /// @param blockNumber A block before the current one.
    /// @return The total weight then.
    function totalValidatorWeightAt(uint256 blockNumber) external view returns (uint256) {
        return totalWeightHistory.upperLookupRecent(_pastKey(blockNumber));
    }

    // ------------------------------------------------------------------ internals

    function _bindPeer(Node storage n, bytes calldata peerId, bytes calldata peerSig) internal {
        address key = peerKeyAddress(peerId);
        (address signer, ECDSA.RecoverError error,) =
            ECDSA.tryRecover(MessageHashUtils.toEthSignedMessageHash(peerBindingHash(msg.sender)), peerSig);
        if (error != ECDSA.RecoverError.NoError || signer != key) revert PeerSignatureInvalid();
        bytes32 id = keccak256(peerId);
        address owner = peerOwner[id];
        if (owner != address(0)) revert PeerIdTaken(owner);
        peerOwner[id] = msg.sender;
        n.peerId = peerId;
    }

    function _syncWeight(address node, Node storage n) internal {
        uint256 stake = uint256(n.active) + n.locked;
        uint256 weight = n.roles & ROLE_VALIDATOR != 0 && stake >= minValidatorStake ? stake : 0;
        Checkpoints.Trace208 storage history = weightHistory[node];
        uint256 previous = history.latest();
        if (weight == previous) return;
        uint48 key = SafeCast.toUint48(block.number);
        history.push(key, SafeCast.toUint208(weight));
        uint256 total = totalWeightHistory.latest() + weight - previous;
        totalWeightHistory.push(key, SafeCast.toUint208(total));
        emit ValidatorWeightChanged(node, weight, total);
    }

    function _pastKey(uint256 blockNumber) internal view returns (uint48) {
        if (blockNumber >= block.number) revert FutureLookup(blockNumber);
        return SafeCast.toUint48(blockNumber);
    }

    function _modExp(uint256 base, uint256 exponent, uint256 modulus) internal view returns (uint256 result) {
        (bool ok, bytes memory out) = address(0x05).staticcall(abi.encode(32, 32, 32, base, exponent, modulus));
        if (!ok || out.length != 32) revert UnsupportedPeerId();
        result = abi.decode(out, (uint256));
    }
}

/// @notice What the registry needs to know of the factory.
interface IJobRegistryView {
    function isJob(address job) external view returns (bool);
}
