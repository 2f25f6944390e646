// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Clones} from "@openzeppelin/contracts/proxy/Clones.sol";
import {INodeRegistry, JobSpec} from "./Interfaces.sol";
import {TrainingJob} from "./TrainingJob.sol";

/// @title JobFactory
/// @notice Requesters create training jobs here. Each job is a clone of one TrainingJob implementation,
///         funded with the requester's budget in escrow, and only such jobs may lock and slash stake.
/// @dev Invariants: isJob[a] is true exactly for the clones this factory created. Every job's spec passes
///      `validateSpec`: a whole recipe (model root and name, task name and configuration hash, generation
///      bounds), positive bonds, fees and slashes, each slash capped at its role's minimum stake, and
///      the timeline rule `timeline(spec) < registry.unbondingPeriod()`, stated once here, so a stake that
///      starts unbonding after a committee's snapshot stays slashable until every round of that lease
///      can have ended, plus a keeper margin of at least a day; and the sampled-verification sizing rule,
///      stated once here (`deterrence`): a lease of n = groupSize * tasksPerLease rollouts whose first
///      committee of q = committeeSize members each verifies m = samplesChecked of them catches a cheat on
///      a fraction c of the rollouts with probability P(c) = 1 - (1 - c)^(m * q) (independent draws: each
///      member's sample comes from its own randomness; one member that finds a fake rejects and, outvoted,
///      appeals to a round that verifies everything). For every c >= minCheatPpm / 1e6 the expected slash
///      P(c) * slashAmount must exceed the gain c * n * rewardPerSample (the pay of the faked rollouts: at
///      most the compute a cheater saves). P(c) * slash - c * gain is concave in c, so checking the two ends
///      c = minCheatPpm / 1e6 and c = 1 covers every c between; miss chances round up, so rounding never
///      lets a spec through that exact arithmetic would refuse.
contract JobFactory {
    /// @notice Slack left to keepers after a lease's last possible round, inside the unbonding period.
    uint64 public constant KEEPER_MARGIN = 1 days;
    /// @notice Most appeal rounds a job may allow.
    uint32 public constant MAX_APPEAL_ROUNDS = 3;
    /// @notice Largest expected first-round committee.
    uint32 public constant MAX_COMMITTEE = 64;
    /// @notice Shortest vote and appeal windows: members must have time to verify, object and appeal.
    uint64 public constant MIN_WINDOW = 60;
    /// @notice The absent penalty is at most this fraction (1/n) of the voter slash: small and bounded.
    uint256 public constant ABSENT_PENALTY_DIVISOR = 10;
    /// @notice Longest model and task names, in bytes.
    uint256 public constant MAX_NAME_BYTES = 256;
    /// @notice Most new tokens a recipe may ask of a completion.
    uint32 public constant MAX_NEW_TOKENS = 4096;
    /// @notice Highest sampling temperature, x 1000.
    uint32 public constant MAX_TEMPERATURE_MILLI = 5000;
    /// @notice Lowest sampling temperature, x 1000: below it, honest arithmetic differences between machines
    ///         decide the sampled token, and the validators' checks have no tolerance left.
    uint32 public constant MIN_TEMPERATURE_MILLI = 100;
    /// @notice Cheat fractions are in parts per million of a lease's rollouts.
    uint32 public constant PPM = 1_000_000;
    uint256 internal constant WAD = 1e18;

    /// @notice The registry whose stake jobs check and slash.
    INodeRegistry public immutable registry;
    /// @notice The TrainingJob implementation every job clones.
    address public immutable implementation;
    /// @notice Whether an address is a job this factory created.
    mapping(address => bool) public isJob;
    /// @notice Every job in creation order.
    address[] public jobs;

    error InvalidSpec(string field);
    error TimelineTooLong(uint256 timeline, uint64 unbondingPeriod);
    error BudgetTooSmall(uint256 budget, uint256 leaseCost);
    error CheatNotDeterred(uint256 cheatPpm, uint256 expectedSlash, uint256 gain);

    event JobCreated(address indexed job, address indexed requester, address indexed trainer, uint256 budget);

    /// @param registry_ The node registry.
    /// @param implementation_ A deployed TrainingJob used as the clone template.
    constructor(INodeRegistry registry_, address implementation_) {
        registry = registry_;
        implementation = implementation_;
    }

    /// @notice Create a job, escrowing msg.value as its budget.
    /// @param spec The job's parameters.
    /// @return job The new job's address.
    function createJob(JobSpec calldata spec) external payable returns (address job) {
        validateSpec(spec);
        uint256 cost = spec.rewardPerSample * spec.groupSize * spec.tasksPerLease;
        if (msg.value < cost) revert BudgetTooSmall(msg.value, cost);
        job = Clones.clone(implementation);
        isJob[job] = true;
        jobs.push(job);
        emit JobCreated(job, msg.sender, spec.trainer, msg.value);
        TrainingJob(payable(job)).initialize{value: msg.value}(spec, msg.sender, registry);
    }

    /// @notice How many jobs exist.
    /// @return The number of jobs created.
    function jobCount() external view returns (uint256) {
        return jobs.length;
    }

    /// @notice The longest a lease's stake can stay at risk after its committee's snapshot, plus the keeper
    ///         margin: lease + every round's vote window + every appeal window + KEEPER_MARGIN.
    /// @param s The spec.
    /// @return Seconds; must be less than the registry's unbonding period.
    function timeline(JobSpec calldata s) public pure returns (uint256) {
        uint256 rounds = uint256(s.appealRounds) + 1;
        return uint256(s.leaseDuration) + rounds * s.voteWindow + (rounds - 1) * s.appealWindow + KEEPER_MARGIN;
    }

    /// @notice Revert with the first invalid field of `s` (InvalidSpec or TimelineTooLong); a view, so a
    ///         client can check a spec before sending it.
    /// @param s The spec.
    function validateSpec(JobSpec calldata s) public view {
        if (s.modelHash == bytes32(0)) revert InvalidSpec("modelHash");
        if (s.taskConfigHash == bytes32(0)) revert InvalidSpec("taskConfigHash");
        if (s.modelFilesHash == bytes32(0)) revert InvalidSpec("modelFilesHash");
        if (!_printableName(s.modelName)) revert InvalidSpec("modelName");
        if (!_printableName(s.taskName)) revert InvalidSpec("taskName");
        if (s.maxNewTokens == 0 || s.maxNewTokens > MAX_NEW_TOKENS) revert InvalidSpec("maxNewTokens");
        if (s.temperatureMilli < MIN_TEMPERATURE_MILLI || s.temperatureMilli > MAX_TEMPERATURE_MILLI) {
            revert InvalidSpec("temperatureMilli");
        }
        if (s.trainer == address(0)) revert InvalidSpec("trainer");
        if (s.groupSize == 0) revert InvalidSpec("groupSize");
        if (s.tasksPerLease == 0) revert InvalidSpec("tasksPerLease");
        if (s.committeeSize == 0 || s.committeeSize > MAX_COMMITTEE) revert InvalidSpec("committeeSize");
        if (s.appealRounds == 0 || s.appealRounds > MAX_APPEAL_ROUNDS) revert InvalidSpec("appealRounds");
        if (s.clipEpsilonMilli == 0 || s.clipEpsilonMilli >= 1000) revert InvalidSpec("clipEpsilonMilli");
        if (s.clipDeltaMilli <= 1000) revert InvalidSpec("clipDeltaMilli");
        if (s.leaseDuration == 0) revert InvalidSpec("leaseDuration");
        if (s.voteWindow < MIN_WINDOW) revert InvalidSpec("voteWindow");
        if (s.appealWindow < MIN_WINDOW) revert InvalidSpec("appealWindow");
        if (s.rewardPerSample == 0 || s.rewardPerSample > type(uint128).max / (uint256(s.groupSize) * s.tasksPerLease))
        {
            revert InvalidSpec("rewardPerSample");
        }
        if (s.slashAmount == 0 || s.slashAmount > registry.minWorkerStake() || s.slashAmount > type(uint128).max) {
            revert InvalidSpec("slashAmount");
        }
        if (s.expiryFee == 0 || s.expiryFee > s.slashAmount) revert InvalidSpec("expiryFee");
        if (s.voterSlash == 0 || s.voterSlash > registry.minValidatorStake()) revert InvalidSpec("voterSlash");
        if (s.absentPenalty == 0 || s.absentPenalty > s.voterSlash / ABSENT_PENALTY_DIVISOR) {
            revert InvalidSpec("absentPenalty");
        }
        if (s.appealBond == 0 || s.appealBond > type(uint128).max) revert InvalidSpec("appealBond");
        if (s.samplesChecked == 0 || s.samplesChecked > uint256(s.groupSize) * s.tasksPerLease) {
            revert InvalidSpec("samplesChecked");
        }
        if (s.minCheatPpm == 0 || s.minCheatPpm > PPM) revert InvalidSpec("minCheatPpm");
        uint256 t = timeline(s);
        uint64 unbonding = registry.unbondingPeriod();
        if (t >= unbonding) revert TimelineTooLong(t, unbonding);
        _requireDeterred(s, s.minCheatPpm);
        _requireDeterred(s, PPM);
    }

    /// @notice The sizing rule at one cheat fraction: the chance, in WAD (1e18), that no first-round member's
    ///         sample holds one of the faked rollouts, (1 - cheatPpm / 1e6)^(samplesChecked * committeeSize),
    ///         rounded up.
    /// @param cheatPpm The faked fraction of a lease's rollouts, in parts per million (at most 1e6).
    /// @param draws Rollouts verified over the committee: samplesChecked * committeeSize.
    /// @return miss The miss chance in WAD.
    function missChance(uint256 cheatPpm, uint256 draws) public pure returns (uint256 miss) {
        uint256 base = WAD - cheatPpm * (WAD / PPM); // 1 - c, exact; reverts on cheatPpm > PPM
        miss = WAD;
        while (draws != 0) {
            if (draws & 1 == 1) miss = _mulUp(miss, base);
            base = _mulUp(base, base);
            draws >>= 1;
        }
    }

    /// @notice The sizing rule's two sides at one cheat fraction, in wei (WAD-scaled inside, so rounding is exact
    ///         to 1e-18 of a wei-valued side): the expected slash P(c) * slashAmount and the gain
    ///         c * groupSize * tasksPerLease * rewardPerSample. The spec deters the cheat iff expectedSlash > gain.
    /// @param s The spec (its amounts already within validateSpec's bounds).
    /// @param cheatPpm The faked fraction, in parts per million.
    /// @return expectedSlashWad The expected slash in wei x 1e18.
    /// @return gainWad The gain in wei x 1e18.
    function deterrence(JobSpec calldata s, uint256 cheatPpm)
        public
        pure
        returns (uint256 expectedSlashWad, uint256 gainWad)
    {
        uint256 miss = missChance(cheatPpm, uint256(s.samplesChecked) * s.committeeSize);
        expectedSlashWad = (WAD - miss) * s.slashAmount;
        gainWad = cheatPpm * (WAD / PPM) * s.groupSize * s.tasksPerLease * s.rewardPerSample;
    }

    function _requireDeterred(JobSpec calldata s, uint256 cheatPpm) internal pure {
        (uint256 expectedSlashWad, uint256 gainWad) = deterrence(s, cheatPpm);
        if (expectedSlashWad <= gainWad) revert CheatNotDeterred(cheatPpm, expectedSlashWad / WAD, gainWad / WAD);
    }

    function _mulUp(uint256 a, uint256 b) internal pure returns (uint256) {
        return (a * b + WAD - 1) / WAD;
    }

    /// @dev 1 to MAX_NAME_BYTES bytes of printable ASCII (0x20-0x7e): every participant reads and prints the
    ///      recipe's names, so none may hold bytes that are not text or that drive a terminal.
    function _printableName(string calldata name) internal pure returns (bool) {
        bytes calldata raw = bytes(name);
        if (raw.length == 0 || raw.length > MAX_NAME_BYTES) return false;
        for (uint256 i = 0; i < raw.length; ++i) {
            if (raw[i] < 0x20 || raw[i] > 0x7e) return false;
        }
        return true;
    }
}
