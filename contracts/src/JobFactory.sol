// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Clones} from "@openzeppelin/contracts/proxy/Clones.sol";
import {INodeRegistry, JobSpec} from "./Interfaces.sol";
import {TrainingJob} from "./TrainingJob.sol";

/// @title JobFactory
/// @notice Requesters create training jobs here. Each job is a clone of one TrainingJob implementation,
///         funded with the requester's budget in escrow, and only such jobs may slash in the registry.
/// @dev Invariant: isJob[a] is true exactly for the clones this factory created; every job's timeline
///      (lease + vote + challenge + resolve windows) is shorter than the registry's unbonding period.
contract JobFactory {
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
        _validate(spec);
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

    function _validate(JobSpec calldata s) internal view {
        if (s.trainer == address(0)) revert InvalidSpec("trainer");
        if (s.groupSize == 0) revert InvalidSpec("groupSize");
        if (s.tasksPerLease == 0) revert InvalidSpec("tasksPerLease");
        if (s.quorum == 0) revert InvalidSpec("quorum");
        if (s.rewardPerSample == 0) revert InvalidSpec("rewardPerSample");
        if (s.leaseDuration == 0) revert InvalidSpec("leaseDuration");
        if (s.voteWindow == 0) revert InvalidSpec("voteWindow");
        if (s.challengeWindow == 0) revert InvalidSpec("challengeWindow");
        if (s.resolveWindow == 0) revert InvalidSpec("resolveWindow");
        if (s.clipEpsilonMilli == 0 || s.clipEpsilonMilli >= 1000) revert InvalidSpec("clipEpsilonMilli");
        if (s.clipDeltaMilli <= 1000) revert InvalidSpec("clipDeltaMilli");
        uint256 timeline = uint256(s.leaseDuration) + s.voteWindow + s.challengeWindow + s.resolveWindow;
        uint64 unbonding = registry.unbondingPeriod();
        if (timeline >= unbonding) revert TimelineTooLong(timeline, unbonding);
    }
}
