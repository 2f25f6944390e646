// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @notice A training job's parameters, fixed at creation.
/// @dev Invariant: one definition shared by the factory, the job and the Python bindings (field order is ABI).
struct JobSpec {
    bytes32 modelHash; // content root of the base policy (version 0)
    bytes32 taskSetId; // which procedural task generator / task file
    address trainer; // publishes policy versions
    address arbiter; // resolves challenges (zero: the requester)
    uint32 groupSize; // completions per task
    uint32 tasksPerLease; // tasks leased together and submitted under one Merkle root
    uint32 maxStaleness; // oldest admissible policy version is current - maxStaleness
    uint32 quorum; // matching validator votes that decide a batch
    uint32 clipEpsilonMilli; // GRPO clip epsilon x 1000
    uint32 clipDeltaMilli; // GRPO negative-advantage ratio cap x 1000
    uint64 leaseDuration; // seconds a worker has to submit
    uint64 voteWindow; // seconds validators have to reach quorum
    uint64 challengeWindow; // seconds a decision can be challenged
    uint64 resolveWindow; // seconds the arbiter has to resolve a challenge
    uint256 rewardPerSample; // wei paid per accepted completion
    uint256 slashAmount; // wei slashed from a rejected worker or a losing validator
    uint256 challengeBond; // wei a challenger posts
}

/// @notice What jobs need of the node registry.
interface INodeRegistry {
    function factory() external view returns (address);
    function isActive(address node, uint8 role) external view returns (bool);
    function unbondingPeriod() external view returns (uint64);
    function slash(address node, uint256 amount, address beneficiary, bytes32 reason) external returns (uint256);
}
