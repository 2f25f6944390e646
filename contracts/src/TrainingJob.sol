// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Initializable} from "@openzeppelin/contracts/proxy/utils/Initializable.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {INodeRegistry, JobSpec} from "./Interfaces.sol";

/// @title TrainingJob
/// @notice One RL post-training job: the requester's escrow, the task queue (leases of `tasksPerLease`
///         tasks, each backed by the worker's locked collateral), the policy clock, stake-weighted validator
///         committees with escalating appeals, and pull payments. Nobody decides an outcome alone: there is
///         no arbiter, and the requester and trainer have no power over outcomes.
/// @dev Deployed as an EIP-1167 clone by JobFactory and initialised once.
///      Value: address(this).balance == escrow + totalOwed + bondsHeld + poolHeld + burned, and
///      reserved <= escrow. `burned` wei stay in this contract forever: no function moves them.
///      A lease moves Leased -> Voting (round 0) -> Decided [-> Voting (appeal round r+1) -> Decided]... ->
///      Paid | Slashed | Lapsed, or Leased -> Returned (expired: the expiry fee is burned).
///      Randomness: a lease's prompt seed is the hash of its claim block, drawn in a later transaction, so
///      the claiming transaction cannot know it; a round's committee seed is the hash of the round's start
///      block and its stakes are those at the end of the block before, so neither the worker nor any
///      validator knew either at submit or appeal time.
///      Committee of round r (self-selection, O(1) per vote): validator v with snapshot weight w (of total W)
///      sits on it with probability min(1, k_r * w / W), k_r = committeeSize * 2^r, and votes with weight
///      max(w, W / k_r), so each side's weight estimates the stake behind it; the final round
///      (r == appealRounds) seats every validator with its own weight. A round is decided as soon as one side
///      holds more than half of W, else at its vote deadline by the larger side (a tie or no votes: Void).
///      The final outcome slashes the worker (if rejected) and every voter who voted against it in any round;
///      lost appeal bonds, those slashes and absent members' penalties go, less BURN_BPS burned, to the
///      winners: winning appellants share APPELLANT_BPS of it and winning voters the rest by vote weight.
///      Nothing is pushed to a participant; the only external contract called is the registry, which calls
///      back only `receive()`.
contract TrainingJob is Initializable {
    enum Status {
        None,
        Leased,
        Voting,
        Decided,
        Paid,
        Slashed,
        Returned,
        Lapsed
    }

    enum Outcome {
        Pending,
        Accept,
        Reject,
        Void
    }

    struct Lease {
        address worker;
        Status status;
        Outcome outcome; // the current round's decision (Pending while its votes are open)
        uint8 round;
        uint64 firstTask;
        uint64 deadline; // lease expiry, then the current round's vote deadline, then its appeal deadline
        uint64 policyVersion; // the clock at the claim, then the version the batch was generated with
        uint64 anchorBlock; // the claim block (its hash seeds the prompts), then the submission block (round 0's start)
        bytes32 seed; // prompt seed (zero until drawn)
        bytes32 root;
    }

    struct Round {
        uint96 acceptWeight;
        uint96 rejectWeight;
        uint64 startBlock; // rounds >= 1; round 0 starts at the lease's anchorBlock after submission
        bytes20 seed; // committee seed (zero until drawn)
        uint96 totalWeight; // all validators' weight at the end of the block before startBlock
    }

    struct Dispute {
        uint128 pending; // wei received for the lease before its final outcome
        uint128 voterPool; // winning voters' part, accumulated
        uint128 appellantPool; // winning appellants' part, accumulated
    }

    uint8 internal constant ROLE_WORKER = 1;
    uint8 internal constant ROLE_VALIDATOR = 2;
    uint256 internal constant VOTE_ACCEPT = 1;
    uint256 internal constant VOTE_REJECT = 2;
    uint256 internal constant ABSENT_BITS = 8; // ballot bit 8 + r: penalized as absent in round r
    uint256 internal constant LOSER_BIT = 1 << 16; // ballot bit: slashed for voting against the final outcome
    /// @notice Basis points of every slash, fee and lost bond that is burned.
    uint256 public constant BURN_BPS = 1000;
    /// @notice Basis points of the rest that winning appellants share (when any won).
    uint256 public constant APPELLANT_BPS = 2500;
    uint256 internal constant BPS = 10_000;

    enum Refusal {
        None,
        NotOpen,
        AlreadyVoted,
        NotMember
    }

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
    /// @notice Appeal bonds currently held.
    uint256 public bondsHeld;
    /// @notice Wei held for lease disputes: received before a final outcome, or winners' unclaimed shares.
    uint256 public poolHeld;
    /// @notice Wei burned (held here forever).
    uint256 public burned;
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
    mapping(uint256 => mapping(uint256 => Round)) internal rounds;
    mapping(uint256 => Dispute) public disputes;
    /// @notice lease => voter => ballot bits: 2 bits per round (1 accept, 2 reject), absent and loser flags.
    mapping(uint256 => mapping(address => uint256)) public ballots;
    /// @notice lease => round (>= 1) => who appealed into it.
    mapping(uint256 => mapping(uint256 => address)) public appellants;
    /// @notice lease => account => dispute rewards already credited.
    mapping(uint256 => mapping(address => uint256)) public rewardClaimed;
    /// @notice Block at which a validator enlisted in this job (0: never); only enlisted validators answer
    ///         for absence, so no job can penalize validators that never agreed to follow it.
    mapping(address => uint64) public enlistedAt;
    /// @notice Block at which an enlisted validator left (0: still enlisted); leaving is final.
    mapping(address => uint64) public delistedAt;

    error NotFactory();
    error NotTrainer();
    error NotRequester();
    error NotLeaseHolder();
    error NotActive(address account, uint8 role);
    error JobClosed();
    error InsufficientEscrow(uint256 available, uint256 needed);
    error VersionNotNext(uint64 current, uint64 proposed);
    error EmptyRoot();
    error WrongStatus(uint256 leaseId, Status status);
    error LeaseExpired(uint256 leaseId, uint64 expiredAt);
    error DeadlineNotReached(uint256 leaseId, uint64 deadline);
    error DeadlinePassed(uint256 leaseId, uint64 deadline);
    error StalePolicy(uint64 version, uint64 current, uint64 maxStaleness);
    error UnpublishedPolicy(uint64 version, uint64 current);
    error SeedNotDrawn(uint256 leaseId);
    error SeedAlreadyDrawn(uint256 leaseId);
    error RandomnessNotReady(uint256 blockNumber);
    error RandomnessExpired(uint256 blockNumber);
    error AlreadyVoted(uint256 leaseId, address validator);
    error NotInCommittee(uint256 leaseId, uint256 round, address validator);
    error FinalRound(uint256 leaseId);
    error WrongBond(uint256 expected, uint256 provided);
    error NotSettled(uint256 leaseId);
    error NotSlashable(uint256 leaseId, address voter);
    error NotAbsent(uint256 leaseId, uint256 round, address member);
    error RoundOpen(uint256 leaseId, uint256 round);
    error NothingOwed();
    error LengthMismatch();
    error UnexpectedPayment();
    error UnknownLease(uint256 leaseId);
    error AlreadyEnlisted(address validator);
    error NotEnlisted(address validator);

    event Initialized(address indexed requester, uint256 budget);
    event PolicyPublished(uint64 indexed version, bytes32 root);
    event TaskClaimed(
        uint256 indexed leaseId,
        address indexed worker,
        uint64 firstTask,
        uint32 count,
        uint64 seedBlock,
        uint64 expiresAt
    );
    event SeedDrawn(uint256 indexed leaseId, bytes32 seed);
    event LeaseReturned(uint256 indexed leaseId, address indexed worker, uint64 firstTask, uint256 fee);
    event BatchSubmitted(
        uint256 indexed leaseId, address indexed worker, bytes32 root, uint64 policyVersion, uint64 voteDeadline
    );
    event CommitteeDrawn(uint256 indexed leaseId, uint256 round, bytes20 seed, uint256 totalWeight);
    event Voted(uint256 indexed leaseId, uint256 round, address indexed validator, bool accept, uint256 weight);
    event VoteSkipped(uint256 indexed leaseId, address indexed validator, Refusal reason);
    event RoundDecided(uint256 indexed leaseId, uint256 round, Outcome outcome, uint64 appealDeadline);
    event Appealed(
        uint256 indexed leaseId, uint256 round, address indexed appellant, uint256 bond, uint64 voteDeadline
    );
    event Settled(uint256 indexed leaseId, address indexed worker, Outcome outcome, uint256 paid);
    event BondRefunded(uint256 indexed leaseId, address indexed appellant, uint256 amount);
    event LoserSlashed(uint256 indexed leaseId, address indexed voter, uint256 amount);
    event AbsentPenalized(uint256 indexed leaseId, uint256 round, address indexed member, uint256 amount);
    event PoolReceived(uint256 indexed leaseId, uint256 toVoters, uint256 toAppellants, uint256 burned);
    event PendingReceived(uint256 indexed leaseId, uint256 amount);
    event RewardClaimed(uint256 indexed leaseId, address indexed account, uint256 amount);
    event FeeBurned(uint256 indexed leaseId, uint256 amount);
    event Enlisted(address indexed validator);
    event Delisted(address indexed validator);
    event PaymentWithdrawn(address indexed account, uint256 amount);
    event JobClosedEvent(uint256 refunded);
    event EscrowRefunded(address indexed requester, uint256 amount);

    /// @dev The implementation itself is locked: only clones can be initialised.
    constructor() {
        _disableInitializers();
    }

    /// @notice Initialise a freshly cloned job. Called once by the factory in the same transaction.
    /// @param spec_ The job's parameters (validated by the factory).
    /// @param requester_ Who created and funds the job.
    /// @param registry_ The node registry used for stake, collateral, committees and slashing.
    function initialize(JobSpec calldata spec_, address requester_, INodeRegistry registry_)
        external
        payable
        initializer
    {
        if (msg.sender != registry_.factory()) revert NotFactory();
        registry = registry_;
        _spec = spec_;
        requester = requester_;
        escrow = msg.value;
        policyRoot[0] = spec_.modelHash;
        emit Initialized(requester_, msg.value);
    }

    // ------------------------------------------------------------------ views

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

    /// @notice One round of a lease: its weights, seed and total, start block and appellant.
    /// @param leaseId The lease.
    /// @param round The round.
    /// @return r The round's record (startBlock filled in for round 0).
    /// @return appellant Who appealed into it (zero for round 0).
    function getRound(uint256 leaseId, uint256 round) external view returns (Round memory r, address appellant) {
        r = rounds[leaseId][round];
        if (round == 0) r.startBlock = leases[leaseId].anchorBlock;
        appellant = appellants[leaseId][round];
    }

    /// @notice The expected committee size of a round (type(uint256).max for the final round: everyone).
    /// @param round The round.
    /// @return k.
    function committeeSizeOf(uint256 round) public view returns (uint256) {
        if (round >= _spec.appealRounds) return type(uint256).max;
        return uint256(_spec.committeeSize) << round;
    }

    /// @notice The bond that appealing into `round` (>= 1) posts: appealBond * 2^(round - 1).
    /// @param round The round the appeal opens.
    /// @return Wei.
    function appealBondFor(uint256 round) public view returns (uint256) {
        return _spec.appealBond << (round - 1);
    }

    /// @notice The vote weight `member` would have in a round's committee (0: not a member, or the round's
    ///         seed is not known yet or no longer recoverable).
    /// @param leaseId The lease.
    /// @param round The round.
    /// @param member The validator.
    /// @return The weight.
    function memberWeight(uint256 leaseId, uint256 round, address member) external view returns (uint256) {
        Lease storage l = leases[leaseId];
        if (!_submitted(l) || round > l.round) return 0;
        return _memberWeight(leaseId, l.worker, round, member, _viewDraw(leaseId, l, round));
    }

    /// @notice A round's committee seed: the stored one once drawn, else the one its start block's hash gives
    ///         (zero while that hash is not known yet, or once it is no longer recoverable). Each member's
    ///         sample of the batch to verify in round 0 is derived from it (rollnet.node.sampling), so it is
    ///         fixed after submission and the worker could not know it.
    /// @param leaseId The lease.
    /// @param round The round.
    /// @return The seed.
    function roundSeed(uint256 leaseId, uint256 round) external view returns (bytes20) {
        Lease storage l = leases[leaseId];
        if (!_submitted(l) || round > l.round) return 0;
        return _viewDraw(leaseId, l, round).seed;
    }

    /// @notice The current round's outcome, counting a vote window that has passed as closed.
    /// @param leaseId The lease.
    /// @return The outcome (Pending while votes are open).
    function outcomeOf(uint256 leaseId) external view returns (Outcome) {
        Lease storage l = leases[leaseId];
        if (l.status == Status.Voting && block.timestamp > l.deadline) return _roundOutcome(leaseId, l.round);
        return l.outcome;
    }

    // ------------------------------------------------------------------ policy clock

    /// @notice Publish the next policy version; the job's clock. Trainer only, exactly current + 1.
    /// @param version The new version number.
    /// @param root The content root of the version's weights.
    function publishPolicy(uint64 version, bytes32 root) external {
        if (msg.sender != _spec.trainer) revert NotTrainer();
        if (version != currentVersion + 1) revert VersionNotNext(currentVersion, version);
        if (root == 0) revert EmptyRoot();
        currentVersion = version;
        policyRoot[version] = root;
        emit PolicyPublished(version, root);
    }

    // ------------------------------------------------------------------ task queue

    /// @notice Lease the next `tasksPerLease` tasks, locking `slashAmount` of the caller's free stake as
    ///         collateral and reserving the lease's pay from escrow. The prompt seed is the hash of this
    ///         block, drawn by `drawSeed` in a later block, so this transaction cannot know its prompts.
    /// @return leaseId The new lease.
    function claim() external returns (uint256 leaseId) {
        if (closed) revert JobClosed();
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
        uint64 expiresAt = uint64(block.timestamp) + _spec.leaseDuration;
        Lease storage l = leases[leaseId];
        l.worker = msg.sender;
        l.status = Status.Leased;
        l.firstTask = first;
        l.deadline = expiresAt;
        l.policyVersion = currentVersion;
        l.anchorBlock = uint64(block.number);
        emit TaskClaimed(leaseId, msg.sender, first, _spec.tasksPerLease, uint64(block.number), expiresAt);
        registry.lockCollateral(msg.sender, _spec.slashAmount); // reverts unless an active worker's free stake covers it
    }

    /// @notice Fix a lease's prompt seed from its claim block's hash. Anyone may call it, from the next
    ///         block on and within 256 blocks; a lease whose seed was never drawn can only expire.
    /// @param leaseId The lease.
    function drawSeed(uint256 leaseId) external {
        Lease storage l = _lease(leaseId);
        if (l.status != Status.Leased) revert WrongStatus(leaseId, l.status);
        if (l.seed != 0) revert SeedAlreadyDrawn(leaseId);
        bytes32 seed = keccak256(abi.encode(_pastBlockHash(l.anchorBlock), address(this), leaseId));
        l.seed = seed;
        emit SeedDrawn(leaseId, seed);
    }

    /// @notice Return an expired, unsubmitted lease's tasks to the queue, release its reservation and its
    ///         collateral, less the expiry fee (burned).
    /// @param leaseId The expired lease.
    function reclaim(uint256 leaseId) external {
        Lease storage l = _lease(leaseId);
        if (l.status != Status.Leased) revert WrongStatus(leaseId, l.status);
        if (block.timestamp <= l.deadline) revert DeadlineNotReached(leaseId, l.deadline);
        l.status = Status.Returned;
        reserved -= leaseCost();
        returnedTasks.push(l.firstTask);
        emit LeaseReturned(leaseId, l.worker, l.firstTask, _spec.expiryFee);
        uint256 fee = registry.releaseCollateral(l.worker, _spec.slashAmount, _spec.expiryFee, "lease-expired");
        burned += fee; // the registry sent `fee` (less only if slashes already reached the collateral)
        emit FeeBurned(leaseId, fee);
    }

    /// @notice Submit a lease's rollout batch: one Merkle root over all its samples, and the published
    ///         policy version it was generated with: at most `maxStaleness` versions old, or at least the
    ///         version current at the claim (so a trainer publishing fast cannot make leases in flight fail).
    ///         Opens round 0.
    /// @param leaseId The caller's lease.
    /// @param root Merkle root of the rollout batch.
    /// @param policyVersion The policy version the rollouts were sampled with.
    function submit(uint256 leaseId, bytes32 root, uint64 policyVersion) external {
        Lease storage l = _lease(leaseId);
        if (l.worker != msg.sender) revert NotLeaseHolder();
        if (l.status != Status.Leased) revert WrongStatus(leaseId, l.status);
        if (block.timestamp > l.deadline) revert LeaseExpired(leaseId, l.deadline);
        if (l.seed == 0) revert SeedNotDrawn(leaseId);
        if (root == 0) revert EmptyRoot();
        uint64 current = currentVersion;
        if (policyVersion > current) revert UnpublishedPolicy(policyVersion, current);
        if (current - policyVersion > _spec.maxStaleness && policyVersion < l.policyVersion) {
            revert StalePolicy(policyVersion, current, _spec.maxStaleness);
        }
        uint64 voteDeadline = uint64(block.timestamp) + _spec.voteWindow;
        l.status = Status.Voting;
        l.root = root;
        l.policyVersion = policyVersion;
        l.anchorBlock = uint64(block.number);
        l.deadline = voteDeadline;
        emit BatchSubmitted(leaseId, msg.sender, root, policyVersion, voteDeadline);
    }

    // ------------------------------------------------------------------ committees

    /// @notice Enlist the caller, an active validator, to follow this job: from the next block on it answers
    ///         for absence from the committees it is drawn for (any validator may vote where drawn).
    function enlist() external {
        if (enlistedAt[msg.sender] != 0) revert AlreadyEnlisted(msg.sender);
        if (!registry.isActive(msg.sender, ROLE_VALIDATOR)) revert NotActive(msg.sender, ROLE_VALIDATOR);
        enlistedAt[msg.sender] = uint64(block.number);
        emit Enlisted(msg.sender);
    }

    /// @notice Stop following this job: rounds starting after this block no longer count the caller absent
    ///         (rounds already started still do). Final: the address cannot enlist again.
    function delist() external {
        if (enlistedAt[msg.sender] == 0 || delistedAt[msg.sender] != 0) revert NotEnlisted(msg.sender);
        delistedAt[msg.sender] = uint64(block.number);
        emit Delisted(msg.sender);
    }

    /// @notice Whether `validator` was enlisted when a round starting at `startBlock` took its snapshot.
    /// @param validator The validator.
    /// @param startBlock The round's start block.
    /// @return True if enlisted before the start block and not delisted before it.
    function enlistedFor(address validator, uint256 startBlock) public view returns (bool) {
        uint256 since = enlistedAt[validator];
        uint256 left = delistedAt[validator];
        return since != 0 && since < startBlock && (left == 0 || left >= startBlock);
    }

    /// @notice Fix the current round's committee (seed and total weight) from its start block's hash.
    ///         Votes do this themselves; anyone may call it so the randomness is not lost after 256 blocks.
    /// @param leaseId The lease.
    function drawCommittee(uint256 leaseId) external {
        Lease storage l = _lease(leaseId);
        if (l.status != Status.Voting) revert WrongStatus(leaseId, l.status);
        (bool ready, uint256 start) = _drawRound(leaseId, l, l.round);
        if (!ready) {
            if (block.number <= start) revert RandomnessNotReady(start);
            revert RandomnessExpired(start);
        }
    }

    /// @notice Vote on the current round of a lease, as a member of its committee.
    /// @param leaseId The lease.
    /// @param accept True to accept, false to reject.
    function vote(uint256 leaseId, bool accept) external {
        Lease storage l = _lease(leaseId);
        Refusal refusal = _vote(leaseId, l, accept);
        if (refusal == Refusal.NotOpen) {
            if (l.status != Status.Voting) revert WrongStatus(leaseId, l.status);
            revert DeadlinePassed(leaseId, l.deadline);
        }
        if (refusal == Refusal.AlreadyVoted) revert AlreadyVoted(leaseId, msg.sender);
        if (refusal == Refusal.NotMember) revert NotInCommittee(leaseId, l.round, msg.sender);
    }

    /// @notice Vote on many leases in one transaction; a lease where the vote cannot count (closed,
    ///         already voted, not a member) is skipped with an event instead of reverting.
    /// @param leaseIds The leases.
    /// @param accepts One verdict per lease.
    function voteBatch(uint256[] calldata leaseIds, bool[] calldata accepts) external {
        if (leaseIds.length != accepts.length) revert LengthMismatch();
        for (uint256 i = 0; i < leaseIds.length; ++i) {
            uint256 id = leaseIds[i];
            Refusal refusal = _vote(id, _lease(id), accepts[i]);
            if (refusal != Refusal.None) emit VoteSkipped(id, msg.sender, refusal);
        }
    }

    /// @notice Appeal the current round's decision (or a vote window that closed) with the round's bond.
    ///         Any active worker or validator may; the next round's committee is larger and drawn afresh.
    /// @param leaseId The lease.
    function appeal(uint256 leaseId) external payable {
        Lease storage l = _lease(leaseId);
        _closeIfDue(leaseId, l);
        if (l.status != Status.Decided) revert WrongStatus(leaseId, l.status);
        uint256 next = uint256(l.round) + 1;
        if (next > _spec.appealRounds) revert FinalRound(leaseId);
        if (block.timestamp > l.deadline) revert DeadlinePassed(leaseId, l.deadline);
        uint256 bond = appealBondFor(next);
        if (msg.value != bond) revert WrongBond(bond, msg.value);
        if (!registry.isActive(msg.sender, ROLE_VALIDATOR) && !registry.isActive(msg.sender, ROLE_WORKER)) {
            revert NotActive(msg.sender, ROLE_WORKER | ROLE_VALIDATOR);
        }
        uint64 voteDeadline = uint64(block.timestamp) + _spec.voteWindow;
        l.round = uint8(next);
        l.status = Status.Voting;
        l.outcome = Outcome.Pending;
        l.deadline = voteDeadline;
        rounds[leaseId][next].startBlock = uint64(block.number);
        appellants[leaseId][next] = msg.sender;
        bondsHeld += bond;
        emit Appealed(leaseId, next, msg.sender, bond, voteDeadline);
    }

    // ------------------------------------------------------------------ settlement

    /// @notice Settle a lease once its outcome is final (the final round decided, or the appeal window of
    ///         a decision passed): accepted pays the worker, rejected takes its collateral, void pays nobody;
    ///         appeal bonds are refunded to winning appellants, lost ones go to the winners.
    /// @param leaseId The lease.
    function finalize(uint256 leaseId) external {
        Lease storage l = _lease(leaseId);
        _closeIfDue(leaseId, l);
        if (l.status != Status.Decided) revert WrongStatus(leaseId, l.status);
        if (l.round < _spec.appealRounds && block.timestamp <= l.deadline) {
            revert DeadlineNotReached(leaseId, l.deadline);
        }
        _settle(leaseId, l);
    }

    /// @notice Slash a voter who voted against a settled lease's final outcome in any round (once per lease);
    ///         the wei go to the lease's winners. Where the first round is sampled (samplesChecked below the
    ///         lease's rollouts), a first-round accept that a later round overturned is not slashable: a sample
    ///         can prove a fake, never the absence of one, so an honest member whose sample missed the faked
    ///         rollouts voted in good faith (else a cheating worker and one validator that rejects and
    ///         appeals could make every other member of round 0 pay for the cheat). Sampled rejections are
    ///         proof and stay slashable when wrong.
    /// @param leaseId The settled lease.
    /// @param voter The losing voter.
    function slashLoser(uint256 leaseId, address voter) external {
        Lease storage l = _lease(leaseId);
        if (!_settled(l)) revert NotSettled(leaseId);
        uint256 ballot = ballots[leaseId][voter];
        if (ballot & LOSER_BIT != 0 || !_votedAgainst(ballot, l.round, l.outcome, _sampledFirstRound())) {
            revert NotSlashable(leaseId, voter);
        }
        ballots[leaseId][voter] = ballot | LOSER_BIT;
        uint256 taken = registry.slash(voter, _spec.voterSlash, "lost-vote");
        emit LoserSlashed(leaseId, voter, taken);
        _receiveForLease(leaseId, l, taken);
    }

    /// @notice Penalize an enlisted committee member who did not vote in a round that ran to its deadline (a
    ///         round decided early asks nothing more of its members); the wei go to the lease's winners.
    /// @param leaseId The lease.
    /// @param round The closed round.
    /// @param member The absent member.
    function penalizeAbsent(uint256 leaseId, uint256 round, address member) external {
        Lease storage l = _lease(leaseId);
        _closeIfDue(leaseId, l);
        if (!_submitted(l) || round > l.round) revert WrongStatus(leaseId, l.status);
        if (round == l.round && l.status == Status.Voting) revert RoundOpen(leaseId, round);
        (bool ready,) = _drawRound(leaseId, l, round);
        Round storage rd = rounds[leaseId][round];
        uint256 leading = rd.acceptWeight > rd.rejectWeight ? rd.acceptWeight : rd.rejectWeight;
        uint256 ballot = ballots[leaseId][member];
        uint256 absentBit = 1 << (ABSENT_BITS + round);
        if (!ready || 2 * leading > rd.totalWeight || (ballot >> (2 * round)) & 3 != 0 || ballot & absentBit != 0) {
            revert NotAbsent(leaseId, round, member);
        }
        Draw memory draw = _storedDraw(leaseId, l, round);
        if (!enlistedFor(member, draw.start)) revert NotEnlisted(member);
        if (_memberWeight(leaseId, l.worker, round, member, draw) == 0) revert NotInCommittee(leaseId, round, member);
        ballots[leaseId][member] = ballot | absentBit;
        uint256 taken = registry.slash(member, _spec.absentPenalty, "absent");
        emit AbsentPenalized(leaseId, round, member, taken);
        _receiveForLease(leaseId, l, taken);
    }

    /// @notice Credit the caller's share of a settled lease's winnings (as a winning voter, by vote weight,
    ///         and as a winning appellant); callable again as more losers are slashed.
    /// @param leaseId The settled lease.
    function claimReward(uint256 leaseId) external {
        Lease storage l = _lease(leaseId);
        if (!_settled(l)) revert NotSettled(leaseId);
        uint256 entitled = rewardOf(leaseId, msg.sender);
        uint256 already = rewardClaimed[leaseId][msg.sender];
        if (entitled <= already) revert NothingOwed();
        uint256 amount = entitled - already;
        rewardClaimed[leaseId][msg.sender] = entitled;
        poolHeld -= amount;
        _credit(msg.sender, amount);
        emit RewardClaimed(leaseId, msg.sender, amount);
    }

    /// @notice Everything `account` is entitled to from a settled lease's pools so far (claimed or not).
    /// @param leaseId The lease.
    /// @param account The winner.
    /// @return entitled Wei.
    function rewardOf(uint256 leaseId, address account) public view returns (uint256 entitled) {
        Lease storage l = leases[leaseId];
        if (!_settled(l)) return 0;
        Dispute storage d = disputes[leaseId];
        (uint256 winningWeight, uint256 winningAppellants) = _winners(leaseId, l);
        if (winningWeight > 0 && d.voterPool > 0) {
            entitled += uint256(d.voterPool) * _winningWeightOf(leaseId, l, account) / winningWeight;
        }
        if (winningAppellants > 0 && d.appellantPool > 0) {
            entitled += uint256(d.appellantPool) * _appealsWonBy(leaseId, l, account) / winningAppellants;
        }
    }

    // ------------------------------------------------------------------ money

    /// @notice Withdraw everything owed to the caller (worker pay, refunded bonds, rewards).
    function withdrawPayment() external {
        uint256 amount = owed[msg.sender];
        if (amount == 0) revert NothingOwed();
        owed[msg.sender] = 0;
        totalOwed -= amount;
        emit PaymentWithdrawn(msg.sender, amount);
        Address.sendValue(payable(msg.sender), amount);
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
        if (free > 0) Address.sendValue(payable(msg.sender), free);
    }

    /// @notice Receives slashed stake from the registry; the caller that triggered the slash accounts for it.
    receive() external payable {
        if (msg.sender != address(registry)) revert UnexpectedPayment();
    }

    // ------------------------------------------------------------------ internals: voting

    function _vote(uint256 leaseId, Lease storage l, bool accept) internal returns (Refusal) {
        if (l.status != Status.Voting || block.timestamp > l.deadline) return Refusal.NotOpen;
        uint256 r = l.round;
        uint256 ballot = ballots[leaseId][msg.sender];
        if ((ballot >> (2 * r)) & 3 != 0) return Refusal.AlreadyVoted;
        (bool ready, uint256 start) = _drawRound(leaseId, l, r);
        if (!ready) return Refusal.NotMember;
        Round storage rd = rounds[leaseId][r];
        uint256 total = rd.totalWeight;
        uint256 weight = _memberWeight(leaseId, l.worker, r, msg.sender, Draw(rd.seed, total, start));
        if (weight == 0) return Refusal.NotMember;
        ballots[leaseId][msg.sender] = ballot | ((accept ? VOTE_ACCEPT : VOTE_REJECT) << (2 * r));
        uint256 side;
        if (accept) {
            side = rd.acceptWeight + weight;
            rd.acceptWeight = SafeCast.toUint96(side);
        } else {
            side = rd.rejectWeight + weight;
            rd.rejectWeight = SafeCast.toUint96(side);
        }
        emit Voted(leaseId, r, msg.sender, accept, weight);
        if (2 * side > total) _decide(leaseId, l, accept ? Outcome.Accept : Outcome.Reject, uint64(block.timestamp));
        return Refusal.None;
    }

    /// @dev Fix round r's seed and total weight if not yet fixed; false when its start block's hash is not
    ///      available (too recent or older than 256 blocks).
    function _drawRound(uint256 leaseId, Lease storage l, uint256 r) internal returns (bool ready, uint256 start) {
        Round storage rd = rounds[leaseId][r];
        start = _roundStart(leaseId, l, r);
        if (rd.seed != 0) return (true, start);
        if (block.number <= start || blockhash(start) == 0) return (false, start);
        bytes20 seed = _committeeSeed(blockhash(start), leaseId, r);
        uint256 total = registry.totalValidatorWeightAt(start - 1);
        rd.seed = seed;
        rd.totalWeight = SafeCast.toUint96(total);
        emit CommitteeDrawn(leaseId, r, seed, total);
        return (true, start);
    }

    function _committeeSeed(bytes32 blockHash, uint256 leaseId, uint256 r) internal view returns (bytes20 seed) {
        seed = bytes20(keccak256(abi.encode(blockHash, address(this), leaseId, r)));
        if (seed == 0) seed = bytes20(uint160(1));
    }

    /// @dev Round r's randomness and stake snapshot, as a voter's weight is computed from them.
    struct Draw {
        bytes20 seed;
        uint256 total;
        uint256 start;
    }

    /// @dev Round r's draw as a view sees it: stored, else computed from the start block's hash (seed zero when
    ///      that hash is unavailable).
    function _viewDraw(uint256 leaseId, Lease storage l, uint256 r) internal view returns (Draw memory draw) {
        draw = _storedDraw(leaseId, l, r);
        if (draw.seed != 0) return draw;
        uint256 start = draw.start;
        if (block.number <= start || blockhash(start) == 0) return draw;
        draw.seed = _committeeSeed(blockhash(start), leaseId, r);
        draw.total = registry.totalValidatorWeightAt(start - 1);
    }

    function _storedDraw(uint256 leaseId, Lease storage l, uint256 r) internal view returns (Draw memory) {
        Round storage rd = rounds[leaseId][r];
        return Draw(rd.seed, rd.totalWeight, _roundStart(leaseId, l, r));
    }

    function _memberWeight(uint256 leaseId, address worker, uint256 r, address member, Draw memory draw)
        internal
        view
        returns (uint256)
    {
        uint256 total = draw.total;
        if (total == 0 || draw.seed == 0 || member == worker) return 0;
        uint256 w = registry.weightAt(member, draw.start - 1);
        if (w == 0) return 0;
        uint256 k = committeeSizeOf(r);
        if (k == type(uint256).max || k * w >= total) return w;
        if (uint256(keccak256(abi.encode(draw.seed, leaseId, r, member))) % total < k * w) return total / k;
        return 0;
    }

    function _roundStart(uint256 leaseId, Lease storage l, uint256 r) internal view returns (uint256) {
        return r == 0 ? l.anchorBlock : rounds[leaseId][r].startBlock;
    }

    function _roundOutcome(uint256 leaseId, uint256 r) internal view returns (Outcome) {
        Round storage rd = rounds[leaseId][r];
        if (rd.acceptWeight > rd.rejectWeight) return Outcome.Accept;
        if (rd.rejectWeight > rd.acceptWeight) return Outcome.Reject;
        return Outcome.Void;
    }

    function _decide(uint256 leaseId, Lease storage l, Outcome outcome, uint64 from) internal {
        uint64 appealDeadline = l.round < _spec.appealRounds ? from + _spec.appealWindow : from;
        l.status = Status.Decided;
        l.outcome = outcome;
        l.deadline = appealDeadline;
        emit RoundDecided(leaseId, l.round, outcome, appealDeadline);
    }

    /// @dev A round whose vote window passed is decided by its larger side, its appeal window counted from
    ///      the vote deadline (so it does not matter when anyone notices).
    function _closeIfDue(uint256 leaseId, Lease storage l) internal {
        if (l.status == Status.Voting && block.timestamp > l.deadline) {
            _decide(leaseId, l, _roundOutcome(leaseId, l.round), l.deadline);
        }
    }

    // ------------------------------------------------------------------ internals: settlement and pools

    function _settle(uint256 leaseId, Lease storage l) internal {
        Outcome outcome = l.outcome;
        uint256 cost = leaseCost();
        address worker = l.worker;
        reserved -= cost;
        Dispute storage d = disputes[leaseId];
        uint256 toWinners = d.pending;
        d.pending = 0;
        for (uint256 r = 1; r <= l.round; ++r) {
            uint256 bond = appealBondFor(r);
            bondsHeld -= bond;
            if (_roundOutcome(leaseId, r - 1) != outcome) {
                _credit(appellants[leaseId][r], bond);
                emit BondRefunded(leaseId, appellants[leaseId][r], bond);
            } else {
                toWinners += bond;
                poolHeld += bond;
            }
        }
        bool rejected = outcome == Outcome.Reject;
        if (outcome == Outcome.Accept) {
            l.status = Status.Paid;
            escrow -= cost;
            _credit(worker, cost);
        } else if (rejected) {
            l.status = Status.Slashed;
        } else {
            l.status = Status.Lapsed;
        }
        emit Settled(leaseId, worker, outcome, outcome == Outcome.Accept ? cost : 0);
        // The registry is the one contract a job calls, and it calls back only receive(): the collateral it
        // takes (all of it for a rejected batch, less only if slashes already reached it) goes to the winners.
        uint256 taken = registry.releaseCollateral(
            worker,
            _spec.slashAmount,
            rejected ? _spec.slashAmount : 0,
            rejected ? bytes32("rejected-batch") : bytes32("lease-settled")
        );
        if (taken > 0) poolHeld += taken;
        _distribute(leaseId, l, d, toWinners + taken);
    }

    /// @dev Wei the registry just sent for this lease (a loser's slash or an absent member's penalty).
    function _receiveForLease(uint256 leaseId, Lease storage l, uint256 amount) internal {
        if (amount == 0) return;
        poolHeld += amount;
        Dispute storage d = disputes[leaseId];
        if (_settled(l)) {
            _distribute(leaseId, l, d, amount);
        } else {
            d.pending += SafeCast.toUint128(amount);
            emit PendingReceived(leaseId, amount);
        }
    }

    /// @dev Split `amount` (already counted in poolHeld) between burn, winning appellants and winning voters;
    ///      with nobody to pay, all of it is burned.
    function _distribute(uint256 leaseId, Lease storage l, Dispute storage d, uint256 amount) internal {
        if (amount == 0) return;
        (uint256 winningWeight, uint256 winningAppellants) = _winners(leaseId, l);
        uint256 burn = amount * BURN_BPS / BPS;
        uint256 rest = amount - burn;
        uint256 toAppellants;
        if (winningAppellants > 0) toAppellants = winningWeight == 0 ? rest : rest * APPELLANT_BPS / BPS;
        uint256 toVoters = winningWeight == 0 ? 0 : rest - toAppellants;
        burn = amount - toAppellants - toVoters;
        d.voterPool += SafeCast.toUint128(toVoters);
        d.appellantPool += SafeCast.toUint128(toAppellants);
        poolHeld -= burn;
        burned += burn;
        emit PoolReceived(leaseId, toVoters, toAppellants, burn);
    }

    /// @dev The winning side's total vote weight over every round, and how many appeals were won.
    function _winners(uint256 leaseId, Lease storage l) internal view returns (uint256 weight, uint256 appeals) {
        Outcome outcome = l.outcome;
        if (outcome != Outcome.Accept && outcome != Outcome.Reject) return (0, 0);
        for (uint256 r = 0; r <= l.round; ++r) {
            Round storage rd = rounds[leaseId][r];
            weight += outcome == Outcome.Accept ? rd.acceptWeight : rd.rejectWeight;
            if (r > 0 && _roundOutcome(leaseId, r - 1) != outcome) ++appeals;
        }
    }

    /// @dev `account`'s vote weight summed over the rounds where it voted with the final outcome.
    function _winningWeightOf(uint256 leaseId, Lease storage l, address account) internal view returns (uint256 mine) {
        uint256 code = l.outcome == Outcome.Accept ? VOTE_ACCEPT : VOTE_REJECT;
        uint256 ballot = ballots[leaseId][account];
        for (uint256 r = 0; r <= l.round; ++r) {
            if ((ballot >> (2 * r)) & 3 == code) {
                mine += _memberWeight(leaseId, l.worker, r, account, _storedDraw(leaseId, l, r));
            }
        }
    }

    /// @dev How many of the lease's appeals `account` made and won.
    function _appealsWonBy(uint256 leaseId, Lease storage l, address account) internal view returns (uint256 won) {
        for (uint256 r = 1; r <= l.round; ++r) {
            if (appellants[leaseId][r] == account && _roundOutcome(leaseId, r - 1) != l.outcome) ++won;
        }
    }

    /// @dev Whether round 0's members verify only a sample of each batch.
    function _sampledFirstRound() internal view returns (bool) {
        return _spec.samplesChecked < uint256(_spec.groupSize) * _spec.tasksPerLease;
    }

    /// @dev Whether a ballot holds a slashable vote against the final outcome: any round's, except a sampled
    ///      first round's accept of a batch finally rejected.
    function _votedAgainst(uint256 ballot, uint256 lastRound, Outcome outcome, bool sampledFirstRound)
        internal
        pure
        returns (bool)
    {
        if (outcome != Outcome.Accept && outcome != Outcome.Reject) return false;
        uint256 winning = outcome == Outcome.Accept ? VOTE_ACCEPT : VOTE_REJECT;
        uint256 first = sampledFirstRound && outcome == Outcome.Reject ? 1 : 0;
        for (uint256 r = first; r <= lastRound; ++r) {
            uint256 code = (ballot >> (2 * r)) & 3;
            if (code != 0 && code != winning) return true;
        }
        return false;
    }

    /// @dev Whether the lease was submitted (and so has rounds): not unknown, still leased, or returned.
    function _submitted(Lease storage l) internal view returns (bool) {
        Status s = l.status;
        return s != Status.None && s != Status.Leased && s != Status.Returned;
    }

    function _settled(Lease storage l) internal view returns (bool) {
        Status s = l.status;
        return s == Status.Paid || s == Status.Slashed || s == Status.Lapsed;
    }

    function _credit(address account, uint256 amount) internal {
        owed[account] += amount;
        totalOwed += amount;
    }

    function _pastBlockHash(uint256 blockNumber) internal view returns (bytes32 h) {
        if (block.number <= blockNumber) revert RandomnessNotReady(blockNumber);
        h = blockhash(blockNumber);
        if (h == 0) revert RandomnessExpired(blockNumber);
    }

    function _lease(uint256 leaseId) internal view returns (Lease storage l) {
        l = leases[leaseId];
        if (l.status == Status.None) revert UnknownLease(leaseId);
    }
}
