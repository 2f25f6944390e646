// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @title NodeRegistry
/// @notice Identity and stake of every rollnet participant. Binds an Ethereum address to a libp2p peer ID
///         and holds the stake that jobs may slash.
/// @dev Invariant: address(this).balance == totalActive + totalUnbonding. Only jobs created by the
///      registered factory may slash, and slashing reaches unbonding stake too.
contract NodeRegistry {
    /// @notice Role bit for rollout workers.
    uint8 public constant ROLE_WORKER = 1;
    /// @notice Role bit for validators.
    uint8 public constant ROLE_VALIDATOR = 2;
    uint8 internal constant ALL_ROLES = ROLE_WORKER | ROLE_VALIDATOR;

    struct Node {
        bytes peerId;
        uint8 roles;
        uint64 unbondReadyAt;
        uint128 active;
        uint128 unbonding;
    }

    /// @notice Minimum active stake for the worker role, in wei.
    uint256 public immutable minWorkerStake;
    /// @notice Minimum active stake for the validator role, in wei.
    uint256 public immutable minValidatorStake;
    /// @notice Seconds between an unbond request and the earliest withdrawal.
    uint64 public immutable unbondingPeriod;
    /// @notice The account allowed to set the factory, once.
    address public immutable deployer;
    /// @notice The job factory whose jobs may slash; set once.
    address public factory;

    uint256 public totalActive;
    uint256 public totalUnbonding;

    mapping(address => Node) internal nodes;
    /// @notice keccak256(peerId) => the address that registered it.
    mapping(bytes32 => address) public peerOwner;
    /// @notice Where a node listens: newline-separated multiaddrs without the /p2p/ suffix (the registered
    ///         peer ID is appended by dialers, so a dial authenticates the registered identity).
    mapping(address => bytes) public listenAddrs;

    /// @notice Longest accepted `listenAddrs` value, in bytes.
    uint256 public constant MAX_ADDRS_LENGTH = 512;

    error InvalidRoles(uint8 roles);
    error EmptyPeerId();
    error PeerIdTaken(address owner);
    error AlreadyRegistered(address node);
    error NotRegistered(address node);
    error StakeBelowMinimum(uint256 minimum, uint256 provided);
    error ZeroAmount();
    error InsufficientActiveStake(uint256 requested, uint256 active);
    error NothingToWithdraw();
    error UnbondingNotFinished(uint64 readyAt);
    error NotDeployer();
    error FactoryAlreadySet();
    error NotAuthorizedSlasher(address caller);
    error TransferFailed();
    error ZeroAddress();
    error AddrsTooLong(uint256 length, uint256 maximum);

    event NodeJoined(address indexed node, bytes peerId, uint8 roles, uint256 stake);
    event PeerIdChanged(address indexed node, bytes peerId);
    event StakeAdded(address indexed node, uint256 amount, uint256 active);
    event UnbondRequested(address indexed node, uint256 amount, uint64 readyAt);
    event Withdrawn(address indexed node, uint256 amount);
    event Slashed(address indexed node, address indexed job, uint256 amount, address beneficiary, bytes32 reason);
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

    /// @notice Set the factory whose jobs may slash. Callable once, by the deployer.
    /// @param factory_ The JobFactory address.
    function setFactory(address factory_) external {
        if (msg.sender != deployer) revert NotDeployer();
        if (factory != address(0)) revert FactoryAlreadySet();
        if (factory_ == address(0)) revert ZeroAddress();
        factory = factory_;
        emit FactorySet(factory_);
    }

    /// @notice Register the caller with a libp2p peer ID and roles, staking msg.value.
    /// @param peerId The libp2p peer ID bytes (multihash) this address will answer as.
    /// @param roles Bitmask of ROLE_WORKER and ROLE_VALIDATOR.
    function join(bytes calldata peerId, uint8 roles) external payable {
        if (roles == 0 || roles & ~ALL_ROLES != 0) revert InvalidRoles(roles);
        if (peerId.length == 0) revert EmptyPeerId();
        Node storage n = nodes[msg.sender];
        if (n.roles != 0) revert AlreadyRegistered(msg.sender);
        uint256 minimum = minStakeFor(roles);
        if (msg.value < minimum) revert StakeBelowMinimum(minimum, msg.value);
        bytes32 key = keccak256(peerId);
        address owner = peerOwner[key];
        if (owner != address(0)) revert PeerIdTaken(owner);

        peerOwner[key] = msg.sender;
        n.peerId = peerId;
        n.roles = roles;
        n.active = uint128(msg.value);
        totalActive += msg.value;
        emit NodeJoined(msg.sender, peerId, roles, msg.value);
    }

    /// @notice Rebind the caller's address to a new libp2p peer ID (key rotation).
    /// @param peerId The new peer ID bytes.
    function setPeerId(bytes calldata peerId) external {
        Node storage n = nodes[msg.sender];
        if (n.roles == 0) revert NotRegistered(msg.sender);
        if (peerId.length == 0) revert EmptyPeerId();
        bytes32 key = keccak256(peerId);
        address owner = peerOwner[key];
        if (owner != address(0)) revert PeerIdTaken(owner);
        delete peerOwner[keccak256(n.peerId)];
        peerOwner[key] = msg.sender;
        n.peerId = peerId;
        emit PeerIdChanged(msg.sender, peerId);
    }

    /// @notice Publish where the caller's libp2p host listens, for peers bootstrapping from the registry.
    /// @param addrs Newline-separated multiaddrs without /p2p/ (empty to withdraw them).
    function setAddrs(bytes calldata addrs) external {
        if (nodes[msg.sender].roles == 0) revert NotRegistered(msg.sender);
        if (addrs.length > MAX_ADDRS_LENGTH) revert AddrsTooLong(addrs.length, MAX_ADDRS_LENGTH);
        listenAddrs[msg.sender] = addrs;
        emit AddrsSet(msg.sender, addrs);
    }

    /// @notice Add msg.value to the caller's active stake.
    function addStake() external payable {
        Node storage n = nodes[msg.sender];
        if (n.roles == 0) revert NotRegistered(msg.sender);
        if (msg.value == 0) revert ZeroAmount();
        n.active += uint128(msg.value);
        totalActive += msg.value;
        emit StakeAdded(msg.sender, msg.value, n.active);
    }

    /// @notice Move `amount` of active stake into unbonding; the whole unbonding balance becomes
    ///         withdrawable `unbondingPeriod` seconds after the latest request.
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
    }

    /// @notice Withdraw all unbonding stake once the unbonding period has passed.
    function withdraw() external {
        Node storage n = nodes[msg.sender];
        uint256 amount = n.unbonding;
        if (amount == 0) revert NothingToWithdraw();
        if (block.timestamp < n.unbondReadyAt) revert UnbondingNotFinished(n.unbondReadyAt);
        n.unbonding = 0;
        totalUnbonding -= amount;
        emit Withdrawn(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed();
    }

    /// @notice Slash up to `amount` from `node`, active stake first, then unbonding stake, and send it
    ///         to `beneficiary`. Only callable by jobs the factory created.
    /// @param node The address to slash.
    /// @param amount Wei to take (capped at what the node holds).
    /// @param beneficiary Who receives the slashed wei.
    /// @param reason A short machine-readable reason.
    /// @return taken The wei actually slashed.
    function slash(address node, uint256 amount, address beneficiary, bytes32 reason)
        external
        returns (uint256 taken)
    {
        address f = factory;
        if (f == address(0) || !IJobRegistryView(f).isJob(msg.sender)) revert NotAuthorizedSlasher(msg.sender);
        if (beneficiary == address(0)) revert ZeroAddress();
        Node storage n = nodes[node];
        uint256 fromActive = amount < n.active ? amount : n.active;
        uint256 rest = amount - fromActive;
        uint256 fromUnbonding = rest < n.unbonding ? rest : n.unbonding;
        n.active -= uint128(fromActive);
        n.unbonding -= uint128(fromUnbonding);
        totalActive -= fromActive;
        totalUnbonding -= fromUnbonding;
        taken = fromActive + fromUnbonding;
        emit Slashed(node, msg.sender, taken, beneficiary, reason);
        if (taken > 0) {
            (bool ok,) = beneficiary.call{value: taken}("");
            if (!ok) revert TransferFailed();
        }
    }

    /// @notice The minimum stake for a role bitmask (the largest minimum among its roles).
    /// @param roles Bitmask of roles.
    /// @return The minimum stake in wei.
    function minStakeFor(uint8 roles) public view returns (uint256) {
        uint256 m = 0;
        if (roles & ROLE_WORKER != 0 && minWorkerStake > m) m = minWorkerStake;
        if (roles & ROLE_VALIDATOR != 0 && minValidatorStake > m) m = minValidatorStake;
        return m;
    }

    /// @notice Whether `node` holds `role` with at least that role's minimum active stake.
    /// @param node The address to check.
    /// @param role A single role bit.
    /// @return True when the node may act in that role now.
    function isActive(address node, uint8 role) external view returns (bool) {
        Node storage n = nodes[node];
        return n.roles & role != 0 && n.active >= minStakeFor(role);
    }

    /// @notice A node's registration.
    /// @param node The address.
    /// @return peerId The bound libp2p peer ID.
    /// @return roles The role bitmask (0 if not registered).
    /// @return active Active stake in wei.
    /// @return unbonding Unbonding stake in wei.
    /// @return unbondReadyAt When unbonding stake becomes withdrawable.
    function nodeInfo(address node)
        external
        view
        returns (bytes memory peerId, uint8 roles, uint256 active, uint256 unbonding, uint64 unbondReadyAt)
    {
        Node storage n = nodes[node];
        return (n.peerId, n.roles, n.active, n.unbonding, n.unbondReadyAt);
    }

    /// @notice The address a libp2p peer ID is registered to (zero if none).
    /// @param peerId The peer ID bytes.
    /// @return The owning address.
    function ownerOfPeer(bytes calldata peerId) external view returns (address) {
        return peerOwner[keccak256(peerId)];
    }
}

/// @notice What the registry needs to know of the factory.
interface IJobRegistryView {
    function isJob(address job) external view returns (bool);
}
