// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {TestBase} from "./TestBase.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {JobFactory} from "../src/JobFactory.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {INodeRegistry, JobSpec} from "../src/Interfaces.sol";

/// @title Fixture
/// @notice A deployed registry + factory + job template with anvil-like stakes, named actors and
///         helpers for the job lifecycle. Shared by the unit, fuzz, gas and invariant suites.
/// @dev Invariant: setUp leaves a registry whose factory is set, so any job created here can slash.
abstract contract Fixture is TestBase {
    uint256 internal constant MIN_WORKER = 1 ether;
    uint256 internal constant MIN_VALIDATOR = 2 ether;
    uint64 internal constant UNBONDING = 7 days;

    uint8 internal constant WORKER = 1;
    uint8 internal constant VALIDATOR = 2;
    uint8 internal constant BOTH = 3;

    NodeRegistry internal registry;
    JobFactory internal factory;
    TrainingJob internal implementation;

    address internal requester;
    address internal trainer;
    address internal arbiter;
    address internal worker;
    address internal worker2;
    address internal v1;
    address internal v2;
    address internal v3;
    address internal outsider;

    function _deploy() internal {
        registry = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        implementation = new TrainingJob();
        factory = new JobFactory(INodeRegistry(address(registry)), address(implementation));
        registry.setFactory(address(factory));
        vm.label(address(registry), "registry");
        vm.label(address(factory), "factory");
        vm.label(address(implementation), "implementation");

        requester = makeAddr("requester");
        trainer = makeAddr("trainer");
        arbiter = makeAddr("arbiter");
        worker = makeAddr("worker");
        worker2 = makeAddr("worker2");
        v1 = makeAddr("v1");
        v2 = makeAddr("v2");
        v3 = makeAddr("v3");
        outsider = makeAddr("outsider");
        address[9] memory all = [requester, trainer, arbiter, worker, worker2, v1, v2, v3, outsider];
        for (uint256 i = 0; i < all.length; ++i) {
            vm.deal(all[i], 1000 ether);
        }
    }

    /// @notice A valid spec: 4 completions x 2 tasks a lease, quorum 2, staleness 2, short windows.
    function _spec() internal view returns (JobSpec memory s) {
        s.modelHash = keccak256("base-model");
        s.taskSetId = keccak256("gsm8k-procedural");
        s.trainer = trainer;
        s.arbiter = arbiter;
        s.groupSize = 4;
        s.tasksPerLease = 2;
        s.maxStaleness = 2;
        s.quorum = 2;
        s.clipEpsilonMilli = 200;
        s.clipDeltaMilli = 4000;
        s.leaseDuration = 1 hours;
        s.voteWindow = 1 hours;
        s.challengeWindow = 1 days;
        s.resolveWindow = 2 days;
        s.rewardPerSample = 0.001 ether;
        s.slashAmount = 0.5 ether;
        s.challengeBond = 0.1 ether;
    }

    function _cost(JobSpec memory s) internal pure returns (uint256) {
        return s.rewardPerSample * s.groupSize * s.tasksPerLease;
    }

    function _join(address who, uint8 roles, uint256 stake) internal {
        vm.prank(who);
        registry.join{value: stake}(abi.encodePacked("peer-", who), roles);
    }

    function _createJob(JobSpec memory s, uint256 budget) internal returns (TrainingJob job) {
        vm.prank(requester);
        job = TrainingJob(payable(factory.createJob{value: budget}(s)));
        vm.label(address(job), "job");
    }

    function _claim(TrainingJob job, address who) internal returns (uint256 id) {
        vm.prank(who);
        id = job.claim();
    }

    function _submit(TrainingJob job, address who, uint256 id, uint64 version) internal {
        vm.prank(who);
        job.submit(id, keccak256(abi.encode("rollouts", id)), version);
    }

    function _attest(TrainingJob job, address who, uint256 id, bool accept) internal {
        vm.prank(who);
        job.attest(id, accept);
    }

    function _status(TrainingJob job, uint256 id) internal view returns (TrainingJob.Status) {
        return job.getLease(id).status;
    }

    function _deadline(TrainingJob job, uint256 id) internal view returns (uint64) {
        return job.getLease(id).deadline;
    }

    function _active(address who) internal view returns (uint256 active) {
        (,, active,,) = registry.nodeInfo(who);
    }

    function _unbonding(address who) internal view returns (uint256 unbonding) {
        (,,, unbonding,) = registry.nodeInfo(who);
    }

    function _assertJobSolvent(TrainingJob job) internal view {
        assertEq(
            address(job).balance, job.escrow() + job.totalOwed() + job.bondsHeld(), "job balance != escrow+owed+bonds"
        );
        assertLe(job.reserved(), job.escrow(), "reserved > escrow");
    }

    function _assertRegistrySolvent() internal view {
        assertEq(
            address(registry).balance,
            registry.totalActive() + registry.totalUnbonding(),
            "registry balance != active+unbonding"
        );
    }
}
