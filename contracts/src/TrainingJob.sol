// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {INodeRegistry, JobSpec} from "./Interfaces.sol";

/// @title TrainingJob
/// @notice One RL post-training job: the requester's escrow, the task queue (leases of
///         `tasksPerLease` tasks), the policy clock, validator attestations, challenges and pull payments.
/// @dev Deployed as an EIP-1167 clone by JobFactory and initialised once.
///      Invariant: address(this).balance == escrow + totalOwed + bondsHeld, and reserved <= escrow.
///      A lease moves Leased -> Submitted -> Accepted|Rejected [-> Challenged] -> Paid|Slashed,
///      or Leased -> Returned (lease expired) or Submitted -> Lapsed (no quorum in the vote window).
///      A validator that voted on a lease cannot challenge it.
contract TrainingJob {
    enum Status {
        None,
        Leased,
        Submitted,
        Accepted,
        Rejected,
        Challenged,
        Paid,
        Slashed,
        Returned,
        Lapsed
    }

    struct Lease {
        address worker;
        uint64 deadline; // lease expiry, then vote deadline, then challenge deadline
        Status status;
        uint64 firstTask;
        uint64 policyVersion;
        uint32 acceptVotes;
        uint32 rejectVotes;
        bytes32 seed;
        bytes32 root;
    }

    struct Challenge {
        address challenger;
        uint64 deadline;
        bool originalAccepted;
        bool overturned;
        bool resolved;
    }

    uint8 internal constant VOTE_ACCEPT = 1;
    uint8 internal constant VOTE_REJECT = 2;
    uint8 internal constant VOTE_SLASHED = 3;
    uint8 internal constant ROLE_WORKER = 1;
    uint8 internal constant ROLE_VALIDATOR = 2;

    JobSpec internal _spec;
    INodeRegistry public registry;
    address public requester;
    bool public closed;

    /// @notice Budget not yet owed to anyone (includes `reserved`).
    uint256 public escrow;
    /// @notice Part of `escrow` promised to open leases.
    uint256 public reserved;
    /// @notice Sum of `owed` over all accounts.
    uint256 public totalOwed;
    /// @notice Challenge bonds currently held.
    uint256 public bondsHeld;
    /// @notice Pull payments waiting for `withdrawPayment`.
    mapping(address => uint256) public owed;

    /// @notice The current policy version (0 is the base model, `modelHash`).
    uint64 public currentVersion;
    /// @notice Content root of each published policy version.
    mapping(uint64 => bytes32) public policyRoot;

    uint64 public nextTask;
    uint64[] internal returnedTasks;
    uint256 public leaseCount;
    mapping(uint256 => Lease) internal leases;
    mapping(uint256 => Challenge) public challenges;
    mapping(uint256 => mapping(address => uint8)) public votes;

    error AlreadyInitialized();
    error NotFactory();
    error NotTrainer();
    error NotRequester();
    error NotArbiter();
    error NotLeaseHolder();
    error NotActive(address account, uint8 role);
    error JobClosed();
    error InsufficientEscrow(uint256 available, uint256 needed);
    error VersionNotIncreasing(uint64 current, uint64 proposed);
    error WrongStatus(uint256 leaseId, Status status);
    error LeaseExpired(uint256 leaseId, uint64 expiredAt);
    error DeadlineNotReached(uint256 leaseId, uint64 deadline);
    error DeadlinePassed(uint256 leaseId, uint64 deadline);
    error StalePolicy(uint64 version, uint64 current, uint64 maxStaleness);
    error FuturePolicy(uint64 version, uint64 current);
    error AlreadyVoted(uint256 leaseId, address validator);
    error WorkerCannotVote();
    error WrongBond(uint256 expected, uint256 provided);
    error NotSlashable(uint256 leaseId, address validator);
    error NothingOwed();
    error LengthMismatch();
    error UnexpectedPayment();
    error TransferFailed();
    error UnknownLease(uint256 leaseId);
    error VoterCannotChallenge(uint256 leaseId, address validator);

    event Initialized(address indexed requester, uint256 budget);
    event PolicyPublished(uint64 indexed version, bytes32 root);
    event TaskClaimed(uint256 indexed leaseId, address indexed worker, uint64 firstTask, uint32 count, bytes32 seed, uint64 expiresAt);
    event LeaseReturned(uint256 indexed leaseId, address indexed worker, uint64 firstTask);
    event BatchSubmitted(uint256 indexed leaseId, address indexed worker, bytes32 root, uint64 policyVersion, uint64 voteDeadline);
    event Attested(uint256 indexed leaseId, address indexed validator, bool accept);
    event AttestationSkipped(uint256 indexed leaseId, address indexed validator, Status status);
    event Decided(uint256 indexed leaseId, bool accepted, uint64 challengeDeadline);
    event Lapsed(uint256 indexed leaseId);
    event Challenged(uint256 indexed leaseId, address indexed challenger, uint256 bond, uint64 resolveDeadline);
    event ChallengeResolved(uint256 indexed leaseId, bool accepted, bool overturned);
    event Settled(uint256 indexed leaseId, address indexed worker, bool accepted, uint256 amount);
    event VoterSlashed(uint256 indexed leaseId, address indexed validator, uint256 amount);
    event PaymentWithdrawn(address indexed account, uint256 amount);
    event SlashReceived(uint256 amount);
    event JobClosedEvent(uint256 refunded);
    event EscrowRefunded(address indexed requester, uint256 amount);

    /// @dev The implementation itself is locked: only clones (which skip this constructor) can be initialised.
    constructor() {
        registry = INodeRegistry(address(1));
    }

    /// @notice Initialise a freshly cloned job. Called once by the factory in the same transaction.
    /// @param spec_ The job's parameters (validated by the factory).
    /// @param requester_ Who created and funds the job.
    /// @param registry_ The node registry used for stake checks and slashing.
    function initialize(JobSpec calldata spec_, address requester_, INodeRegistry registry_) external payable {
        if (address(registry) != address(0)) revert AlreadyInitialized();
        registry = registry_;
        if (msg.sender != registry_.factory()) revert NotFactory();
        _spec = spec_;
        if (_spec.arbiter == address(0)) _spec.arbiter = requester_;
        requester = requester_;
        escrow = msg.value;
        policyRoot[0] = spec_.modelHash;
        emit Initialized(requester_, msg.value);
    }

    /// @notice The job's parameters.
    /// @return The spec.
    function spec() external view returns (JobSpec memory) {
        return _spec;
    }

    /// @notice Wei one accepted lease pays its worker.
    /// @return rewardPerSample * groupSize * tasksPerLease.
    function leaseCost() public view returns (uint256) {
        return _spec.rewardPerSample * _spec.groupSize * _spec.tasksPerLease;
    }

    /// @notice A lease's full record.
    /// @param leaseId The lease.
    /// @return The lease.
    function getLease(uint256 leaseId) external view returns (Lease memory) {
        return leases[leaseId];
    }

    // ------------------------------------------------------------------ policy clock

    /// @notice Publish a new policy version; the job's clock. Trainer only, strictly increasing.
    /// @param version The new version number.
    /// @param root The content root of the version's weights.
    function publishPolicy(uint64 version, bytes32 root) external {
        if (msg.sender != _spec.trainer) revert NotTrainer();
        if (version <= currentVersion) revert VersionNotIncreasing(currentVersion, version);
        currentVersion = version;
        policyRoot[version] = root;
        emit PolicyPublished(version, root);
    }

    // ------------------------------------------------------------------ task queue

    /// @notice Lease the next `tasksPerLease` tasks. Their prompt seed comes from block randomness now,
    ///         so the worker cannot pick prompts. Reserves the lease's pay from escrow.
    /// @return leaseId The new lease.
    function claim() external returns (uint256 leaseId) {
        if (closed) revert JobClosed();
        _requireActive(msg.sender, ROLE_WORKER);
        uint256 cost = leaseCost();
        uint256 available = escrow - reserved;
        if (available < cost) revert InsufficientEscrow(available, cost);

        uint64 first;
        uint256 n = returnedTasks.length;
        if (n > 0) {
            first = returnedTasks[n - 1];
            returnedTasks.pop();
        } else {
            first = nextTask;
            nextTask = first + _spec.tasksPerLease;
        }
        reserved += cost;
        leaseId = ++leaseCount;
        bytes32 seed = keccak256(abi.encode(block.prevrandao, blockhash(block.number - 1), address(this), leaseId));
        uint64 expiresAt = uint64(block.timestamp) + _spec.leaseDuration;
        Lease storage l = leases[leaseId];
        l.worker = msg.sender;
        l.deadline = expiresAt;
        l.status = Status.Leased;
        l.firstTask = first;
        l.seed = seed;
        emit TaskClaimed(leaseId, msg.sender, first, _spec.tasksPerLease, seed, expiresAt);
    }

    /// @notice Return an expired, unsubmitted lease's tasks to the queue and release its reservation.
    /// @param leaseId The expired lease.
    function reclaim(uint256 leaseId) external {
        Lease storage l = _lease(leaseId);
        if (l.status != Status.Leased) revert WrongStatus(leaseId, l.status);
        if (block.timestamp <= l.deadline) revert DeadlineNotReached(leaseId, l.deadline);
        l.status = Status.Returned;
        reserved -= leaseCost();
        returnedTasks.push(l.firstTask);
        emit LeaseReturned(leaseId, l.worker, l.firstTask);
    }

    /// @notice Submit a lease's rollout batch: one Merkle root over all its samples, and the policy
    ///         version it was generated with (at most `maxStaleness` versions old).
    /// @param leaseId The caller's lease.
    /// @param root Merkle root of the rollout batch.
    /// @param policyVersion The policy version the rollouts were sampled with.
    function submit(uint256 leaseId, bytes32 root, uint64 policyVersion) external {
        Lease storage l = _lease(leaseId);
        if (l.worker != msg.sender) revert NotLeaseHolder();
        if (l.status != Status.Leased) revert WrongStatus(leaseId, l.status);
        if (block.timestamp > l.deadline) revert LeaseExpired(leaseId, l.deadline);
        uint64 current = currentVersion;
        if (policyVersion > current) revert FuturePolicy(policyVersion, current);
        if (current - policyVersion > _spec.maxStaleness) {
            revert StalePolicy(policyVersion, current, _spec.maxStaleness);
        }
        _requireActive(msg.sender, ROLE_WORKER);
        uint64 voteDeadline = uint64(block.timestamp) + _spec.voteWindow;
        l.status = Status.Submitted;
        l.root = root;
        l.policyVersion = policyVersion;
        l.deadline = voteDeadline;
        emit BatchSubmitted(leaseId, msg.sender, root, policyVersion, voteDeadline);
    }

    // ------------------------------------------------------------------ validation

    /// @notice Vote on a submitted batch. At `quorum` matching votes the batch is decided.
    /// @param leaseId The submitted lease.
    /// @param accept True to accept, false to reject.
    function attest(uint256 leaseId, bool accept) external {
        _requireActive(msg.sender, ROLE_VALIDATOR);
        Lease storage l = _lease(leaseId);
        if (l.status != Status.Submitted) revert WrongStatus(leaseId, l.status);
        _vote(leaseId, l, accept);
    }

    /// @notice Vote on many batches in one transaction. Batches no longer open for votes (decided by
    ///         other validators, or past their deadline) are skipped with an event instead of reverting.
    /// @param leaseIds The leases.
    /// @param accepts One verdict per lease.
    function attestBatch(uint256[] calldata leaseIds, bool[] calldata accepts) external {
        if (leaseIds.length != accepts.length) revert LengthMismatch();
        _requireActive(msg.sender, ROLE_VALIDATOR);
        for (uint256 i = 0; i < leaseIds.length; ++i) {
            uint256 id = leaseIds[i];
            Lease storage l = _lease(id);
            if (l.status != Status.Submitted || block.timestamp > l.deadline || votes[id][msg.sender] != 0) {
                emit AttestationSkipped(id, msg.sender, l.status);
                continue;
            }
            _vote(id, l, accepts[i]);
        }
    }

    /// @notice Close a submitted batch that did not reach quorum within the vote window: no pay, no slash.
    /// @param leaseId The lease.
    function lapse(uint256 leaseId) external {
        Lease storage l = _lease(leaseId);
        if (l.status != Status.Submitted) revert WrongStatus(leaseId, l.status);
        if (block.timestamp <= l.deadline) revert DeadlineNotReached(leaseId, l.deadline);
        l.status = Status.Lapsed;
        reserved -= leaseCost();
        emit Lapsed(leaseId);
    }

    /// @notice Dispute a decided batch within its challenge window by posting `challengeBond`.
    ///         The arbiter resolves; validators on the losing side can then be slashed.
    /// @param leaseId The decided lease.
    function challenge(uint256 leaseId) external payable {
        Lease storage l = _lease(leaseId);
        if (l.status != Status.Accepted && l.status != Status.Rejected) revert WrongStatus(leaseId, l.status);
        if (block.timestamp > l.deadline) revert DeadlinePassed(leaseId, l.deadline);
        if (msg.value != _spec.challengeBond) revert WrongBond(_spec.challengeBond, msg.value);
        // A voter could otherwise challenge its own decision and collect its own slash as the challenger.
        if (votes[leaseId][msg.sender] != 0) revert VoterCannotChallenge(leaseId, msg.sender);
        if (!registry.isActive(msg.sender, ROLE_WORKER) && !registry.isActive(msg.sender, ROLE_VALIDATOR)) {
            revert NotActive(msg.sender, ROLE_WORKER | ROLE_VALIDATOR);
        }
        bool originalAccepted = l.status == Status.Accepted;
        uint64 resolveDeadline = uint64(block.timestamp) + _spec.resolveWindow;
        l.status = Status.Challenged;
        challenges[leaseId] = Challenge(msg.sender, resolveDeadline, originalAccepted, false, false);
        bondsHeld += msg.value;
        emit Challenged(leaseId, msg.sender, msg.value, resolveDeadline);
    }

    /// @notice The arbiter's final word on a challenged batch. If it overturns the decision the challenger
    ///         gets the bond back; otherwise the bond goes to escrow. Then the batch settles.
    /// @param leaseId The challenged lease.
    /// @param accept The final outcome.
    function resolve(uint256 leaseId, bool accept) external {
        if (msg.sender != _spec.arbiter) revert NotArbiter();
        Lease storage l = _lease(leaseId);
        if (l.status != Status.Challenged) revert WrongStatus(leaseId, l.status);
        Challenge storage c = challenges[leaseId];
        if (block.timestamp > c.deadline) revert DeadlinePassed(leaseId, c.deadline);
        bool overturned = accept != c.originalAccepted;
        c.overturned = overturned;
        c.resolved = true;
        uint256 bond = _spec.challengeBond;
        bondsHeld -= bond;
        if (overturned) _credit(c.challenger, bond);
        else escrow += bond;
        emit ChallengeResolved(leaseId, accept, overturned);
        _settle(leaseId, l, accept);
    }

    /// @notice Settle a decided batch after its challenge window (or an unresolved challenge after its
    ///         resolve window, returning the bond): accepted pays the worker, rejected slashes them.
    /// @param leaseId The lease.
    function finalize(uint256 leaseId) external {
        Lease storage l = _lease(leaseId);
        Status s = l.status;
        if (s == Status.Accepted || s == Status.Rejected) {
            if (block.timestamp <= l.deadline) revert DeadlineNotReached(leaseId, l.deadline);
            _settle(leaseId, l, s == Status.Accepted);
        } else if (s == Status.Challenged) {
            Challenge storage c = challenges[leaseId];
            if (block.timestamp <= c.deadline) revert DeadlineNotReached(leaseId, c.deadline);
            c.resolved = true;
            uint256 bond = _spec.challengeBond;
            bondsHeld -= bond;
            _credit(c.challenger, bond);
            _settle(leaseId, l, c.originalAccepted);
        } else {
            revert WrongStatus(leaseId, s);
        }
    }

    /// @notice After a challenge overturned a decision, slash a validator who voted for the losing side;
    ///         the slashed stake goes to the challenger.
    /// @param leaseId The overturned lease.
    /// @param validator A validator who voted with the overturned decision.
    function slashVoter(uint256 leaseId, address validator) external {
        Challenge storage c = challenges[leaseId];
        if (!c.resolved || !c.overturned) revert NotSlashable(leaseId, validator);
        uint8 losingVote = c.originalAccepted ? VOTE_ACCEPT : VOTE_REJECT;
        if (votes[leaseId][validator] != losingVote) revert NotSlashable(leaseId, validator);
        votes[leaseId][validator] = VOTE_SLASHED;
        uint256 taken = registry.slash(validator, _spec.slashAmount, c.challenger, "lost-challenge");
        emit VoterSlashed(leaseId, validator, taken);
    }

    // ------------------------------------------------------------------ money

    /// @notice Withdraw everything owed to the caller (worker pay, returned bonds).
    function withdrawPayment() external {
        uint256 amount = owed[msg.sender];
        if (amount == 0) revert NothingOwed();
        owed[msg.sender] = 0;
        totalOwed -= amount;
        emit PaymentWithdrawn(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed();
    }

    /// @notice Stop new claims and refund the unreserved escrow to the requester. Callable again later to
    ///         sweep escrow released by leases that settle after closing.
    function close() external {
        if (msg.sender != requester) revert NotRequester();
        uint256 free = escrow - reserved;
        escrow -= free;
        if (!closed) {
            closed = true;
            emit JobClosedEvent(free);
        }
        emit EscrowRefunded(msg.sender, free);
        if (free > 0) {
            (bool ok,) = msg.sender.call{value: free}("");
            if (!ok) revert TransferFailed();
        }
    }

    /// @notice Receives slashed stake from the registry; it returns to escrow.
    receive() external payable {
        if (msg.sender != address(registry)) revert UnexpectedPayment();
        escrow += msg.value;
        emit SlashReceived(msg.value);
    }

    // ------------------------------------------------------------------ internals

    function _vote(uint256 leaseId, Lease storage l, bool accept) internal {
        if (block.timestamp > l.deadline) revert DeadlinePassed(leaseId, l.deadline);
        if (msg.sender == l.worker) revert WorkerCannotVote();
        if (votes[leaseId][msg.sender] != 0) revert AlreadyVoted(leaseId, msg.sender);
        votes[leaseId][msg.sender] = accept ? VOTE_ACCEPT : VOTE_REJECT;
        emit Attested(leaseId, msg.sender, accept);
        uint32 quorum = _spec.quorum;
        bool decided;
        if (accept) {
            decided = ++l.acceptVotes >= quorum;
        } else {
            decided = ++l.rejectVotes >= quorum;
        }
        if (decided) {
            uint64 challengeDeadline = uint64(block.timestamp) + _spec.challengeWindow;
            l.status = accept ? Status.Accepted : Status.Rejected;
            l.deadline = challengeDeadline;
            emit Decided(leaseId, accept, challengeDeadline);
        }
    }

    function _settle(uint256 leaseId, Lease storage l, bool accepted) internal {
        uint256 cost = leaseCost();
        reserved -= cost;
        address worker = l.worker;
        if (accepted) {
            l.status = Status.Paid;
            escrow -= cost;
            _credit(worker, cost);
            emit Settled(leaseId, worker, true, cost);
        } else {
            l.status = Status.Slashed;
            emit Settled(leaseId, worker, false, 0);
            // Effects are done; the registry sends the slashed stake back through receive().
            registry.slash(worker, _spec.slashAmount, address(this), "rejected-batch");
        }
    }

    function _credit(address account, uint256 amount) internal {
        owed[account] += amount;
        totalOwed += amount;
    }

    function _requireActive(address account, uint8 role) internal view {
        if (!registry.isActive(account, role)) revert NotActive(account, role);
    }

    function _lease(uint256 leaseId) internal view returns (Lease storage l) {
        l = leases[leaseId];
        if (l.status == Status.None) revert UnknownLease(leaseId);
    }
}
