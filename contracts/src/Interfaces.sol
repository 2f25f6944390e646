// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @notice A training job's parameters, fixed at creation.
/// @dev Invariant: one definition shared by the factory, the job and the Python bindings (field order is ABI).
///      There is no arbiter: outcomes come only from stake-weighted committees of validators and their appeals.
struct JobSpec {
    bytes32 modelHash; // content root of the base policy (version 0): the recipe's model, pinned bit for bit
    bytes32 taskConfigHash; // keccak256 of the task set's canonical configuration (see `taskName`)
    address trainer; // publishes policy versions (and has no other power)
    uint32 groupSize; // completions per task
    uint32 tasksPerLease; // tasks leased together and submitted under one Merkle root
    uint32 maxStaleness; // oldest admissible policy version is current - maxStaleness
    uint32 committeeSize; // expected members of a lease's first committee; doubles each appeal round
    uint32 appealRounds; // appeals allowed; the round after the last appeal is final, and every validator sits on it
    uint32 clipEpsilonMilli; // GRPO clip epsilon x 1000
    uint32 clipDeltaMilli; // GRPO negative-advantage ratio cap x 1000
    uint64 leaseDuration; // seconds a worker has to draw its seed, generate and submit
    uint64 voteWindow; // seconds a committee has to vote in each round
    uint64 appealWindow; // seconds after a round's decision in which it can be appealed
    uint256 rewardPerSample; // wei paid per accepted completion
    uint256 slashAmount; // wei locked from the worker's stake per open lease, taken in full if the lease is rejected
    uint256 expiryFee; // wei taken from that collateral when a lease expires unsubmitted
    uint256 voterSlash; // wei slashed from each voter on the losing side of the final outcome
    uint256 absentPenalty; // wei taken from a drawn committee member who did not vote
    uint256 appealBond; // wei the first appeal posts; each later round's bond doubles
    // The rest of the recipe: how every worker generates and every validator checks, read from here by all.
    string modelName; // the base model's name ("embedded", "smollm2", ...); `modelHash` pins its weights
    string taskName; // a task set registered in rollnet's task registry; `taskConfigHash` pins its configuration
    uint32 maxNewTokens; // most tokens a completion may have
    uint32 temperatureMilli; // sampling temperature x 1000
    bool chatTemplate; // prompts are wrapped in the tokenizer's chat template
    bool stopOnEos; // a completion ends at its first EOS (else it is always maxNewTokens long)
    bytes32 modelFilesHash; // identity of the model's config, tokenizer, chat template and EOS set (node/model/identity.py)
    // Sampled verification: each first-round committee member verifies `samplesChecked` of the lease's
    // groupSize * tasksPerLease rollouts, picked by randomness drawn after submission; appeal rounds verify all.
    uint32 samplesChecked; // rollouts each first-round member verifies, 1..groupSize * tasksPerLease
    uint32 minCheatPpm; // smallest cheat fraction (parts per million of a lease's rollouts) the sizing rule covers
}

/// @notice What jobs need of the node registry.
interface INodeRegistry {
    function factory() external view returns (address);
    function isActive(address node, uint8 role) external view returns (bool);
    function unbondingPeriod() external view returns (uint64);
    function minWorkerStake() external view returns (uint256);
    function minValidatorStake() external view returns (uint256);
    function lockCollateral(address node, uint256 amount) external;
    function releaseCollateral(address node, uint256 amount, uint256 taken, bytes32 reason) external returns (uint256);
    function slash(address node, uint256 amount, bytes32 reason) external returns (uint256);
    function weightsAt(address node, uint256 blockNumber) external view returns (uint256 weight, uint256 total);
    function weightAt(address node, uint256 blockNumber) external view returns (uint256);
    function totalValidatorWeightAt(uint256 blockNumber) external view returns (uint256);
}
