// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Fixture} from "./Fixture.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {JobFactory} from "../src/JobFactory.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {INodeRegistry, JobSpec} from "../src/Interfaces.sol";

/// @notice A registry stand-in that names any chosen address as its factory.
contract FakeRegistry {
    address public factory;

    constructor(address f) {
        factory = f;
    }

    function unbondingPeriod() external pure returns (uint64) {
        return 7 days;
    }
}

/// @title JobFactoryTest
/// @notice createJob success and every validation failure; the job's one-shot initialisation.
contract JobFactoryTest is Fixture {
    function setUp() public {
        _deploy();
    }

    // ------------------------------------------------------------------ createJob

    function test_createJob_escrowsMsgValueAndRegistersJob() public {
        JobSpec memory s = _spec();
        uint256 budget = 5 ether;
        vm.prank(requester);
        address job = factory.createJob{value: budget}(s);
        TrainingJob j = TrainingJob(payable(job));
        assertTrue(factory.isJob(job), "isJob");
        assertEq(factory.jobCount(), 1, "jobCount");
        assertEq(factory.jobs(0), job, "jobs[0]");
        assertEq(j.escrow(), budget, "escrow == msg.value");
        assertEq(address(job).balance, budget, "balance");
        assertEq(j.reserved(), 0, "reserved");
        assertEq(j.requester(), requester, "requester");
        assertEq(address(j.registry()), address(registry), "registry");
        assertEq(j.policyRoot(0), s.modelHash, "version 0 is the base model");
        assertEq(uint256(j.currentVersion()), 0, "currentVersion");
        assertEq(j.leaseCost(), _cost(s), "leaseCost");
        JobSpec memory got = j.spec();
        assertEq(keccak256(abi.encode(got)), keccak256(abi.encode(s)), "spec stored verbatim");
        assertFalse(factory.isJob(address(implementation)), "template is not a job");
    }

    function test_createJob_emitsJobCreatedAndInitialized() public {
        JobSpec memory s = _spec();
        // The clone address is deterministic from the factory nonce (first CREATE from the factory is nonce 1).
        address predicted = _createAddress(address(factory), 1);
        vm.expectEmit(true, true, true, true, address(factory));
        emit JobFactory.JobCreated(predicted, requester, trainer, 2 ether);
        vm.expectEmit(true, false, false, true, predicted);
        emit TrainingJob.Initialized(requester, 2 ether);
        vm.prank(requester);
        address job = factory.createJob{value: 2 ether}(s);
        assertEq(job, predicted, "clone address");
    }

    function test_createJob_zeroArbiterDefaultsToRequester() public {
        JobSpec memory s = _spec();
        s.arbiter = address(0);
        TrainingJob j = _createJob(s, 1 ether);
        assertEq(j.spec().arbiter, requester, "arbiter");
    }

    function test_createJob_budgetExactlyOneLeaseIsEnough() public {
        JobSpec memory s = _spec();
        TrainingJob j = _createJob(s, _cost(s));
        assertEq(j.escrow(), _cost(s), "escrow");
    }

    function test_createJob_manyJobsAreDistinct() public {
        JobSpec memory s = _spec();
        TrainingJob a = _createJob(s, 1 ether);
        TrainingJob b = _createJob(s, 2 ether);
        assertTrue(address(a) != address(b), "distinct clones");
        assertEq(factory.jobCount(), 2, "jobCount");
        assertEq(a.escrow(), 1 ether, "a escrow");
        assertEq(b.escrow(), 2 ether, "b escrow");
    }

    function test_createJob_revertsInvalidSpec_trainer() public {
        JobSpec memory s = _spec();
        s.trainer = address(0);
        _expectInvalid(s, "trainer");
    }

    function test_createJob_revertsInvalidSpec_groupSize() public {
        JobSpec memory s = _spec();
        s.groupSize = 0;
        _expectInvalid(s, "groupSize");
    }

    function test_createJob_revertsInvalidSpec_tasksPerLease() public {
        JobSpec memory s = _spec();
        s.tasksPerLease = 0;
        _expectInvalid(s, "tasksPerLease");
    }

    function test_createJob_revertsInvalidSpec_quorum() public {
        JobSpec memory s = _spec();
        s.quorum = 0;
        _expectInvalid(s, "quorum");
    }

    function test_createJob_revertsInvalidSpec_rewardPerSample() public {
        JobSpec memory s = _spec();
        s.rewardPerSample = 0;
        _expectInvalid(s, "rewardPerSample");
    }

    function test_createJob_revertsInvalidSpec_leaseDuration() public {
        JobSpec memory s = _spec();
        s.leaseDuration = 0;
        _expectInvalid(s, "leaseDuration");
    }

    function test_createJob_revertsInvalidSpec_voteWindow() public {
        JobSpec memory s = _spec();
        s.voteWindow = 0;
        _expectInvalid(s, "voteWindow");
    }

    function test_createJob_revertsInvalidSpec_challengeWindow() public {
        JobSpec memory s = _spec();
        s.challengeWindow = 0;
        _expectInvalid(s, "challengeWindow");
    }

    function test_createJob_revertsInvalidSpec_resolveWindow() public {
        JobSpec memory s = _spec();
        s.resolveWindow = 0;
        _expectInvalid(s, "resolveWindow");
    }

    function test_createJob_revertsInvalidSpec_clipEpsilonZeroOrAtLeastOne() public {
        JobSpec memory s = _spec();
        s.clipEpsilonMilli = 0;
        _expectInvalid(s, "clipEpsilonMilli");
        s.clipEpsilonMilli = 1000;
        _expectInvalid(s, "clipEpsilonMilli");
        s.clipEpsilonMilli = 999;
        TrainingJob j = _createJob(s, 1 ether);
        assertEq(uint256(j.spec().clipEpsilonMilli), 999, "999 accepted");
    }

    function test_createJob_revertsInvalidSpec_clipDeltaNotAboveOne() public {
        JobSpec memory s = _spec();
        s.clipDeltaMilli = 1000;
        _expectInvalid(s, "clipDeltaMilli");
        s.clipDeltaMilli = 0;
        _expectInvalid(s, "clipDeltaMilli");
        s.clipDeltaMilli = 1001;
        TrainingJob j = _createJob(s, 1 ether);
        assertEq(uint256(j.spec().clipDeltaMilli), 1001, "1001 accepted");
    }

    function test_createJob_revertsTimelineTooLong_atUnbondingPeriod() public {
        JobSpec memory s = _spec();
        s.leaseDuration = 1 days;
        s.voteWindow = 1 days;
        s.challengeWindow = 2 days;
        s.resolveWindow = 3 days; // sum == 7 days == unbonding period: not strictly shorter
        vm.expectRevert(abi.encodeWithSelector(JobFactory.TimelineTooLong.selector, uint256(7 days), UNBONDING));
        vm.prank(requester);
        factory.createJob{value: 1 ether}(s);
        s.resolveWindow = 3 days - 1;
        TrainingJob j = _createJob(s, 1 ether);
        assertTrue(factory.isJob(address(j)), "one second shorter is accepted");
    }

    function test_createJob_timelineSumDoesNotOverflow() public {
        JobSpec memory s = _spec();
        s.leaseDuration = type(uint64).max;
        s.voteWindow = type(uint64).max;
        uint256 timeline = uint256(type(uint64).max) * 2 + s.challengeWindow + s.resolveWindow;
        vm.expectRevert(abi.encodeWithSelector(JobFactory.TimelineTooLong.selector, timeline, UNBONDING));
        vm.prank(requester);
        factory.createJob{value: 1 ether}(s);
    }

    function test_createJob_revertsBudgetTooSmall() public {
        JobSpec memory s = _spec();
        uint256 cost = _cost(s);
        vm.expectRevert(abi.encodeWithSelector(JobFactory.BudgetTooSmall.selector, cost - 1, cost));
        vm.prank(requester);
        factory.createJob{value: cost - 1}(s);
        assertEq(factory.jobCount(), 0, "no job");
    }

    function test_createJob_revertsWhenRegistryHasNoFactory() public {
        // A factory whose registry points elsewhere cannot initialise its clones.
        NodeRegistry lone = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        JobFactory orphan = new JobFactory(INodeRegistry(address(lone)), address(implementation));
        vm.expectRevert(TrainingJob.NotFactory.selector);
        vm.prank(requester);
        orphan.createJob{value: 1 ether}(_spec());
        assertEq(orphan.jobCount(), 0, "rolled back");
    }

    // ------------------------------------------------------------------ initialize

    function test_initialize_revertsAlreadyInitialized_onClone_evenForFactory() public {
        TrainingJob j = _createJob(_spec(), 1 ether);
        JobSpec memory s = _spec();
        vm.expectRevert(TrainingJob.AlreadyInitialized.selector);
        vm.prank(address(factory));
        j.initialize(s, outsider, INodeRegistry(address(registry)));
        vm.expectRevert(TrainingJob.AlreadyInitialized.selector);
        vm.prank(outsider);
        j.initialize(s, outsider, INodeRegistry(address(registry)));
        assertEq(j.requester(), requester, "requester unchanged");
    }

    function test_initialize_revertsAlreadyInitialized_onLockedImplementation() public {
        JobSpec memory s = _spec();
        vm.expectRevert(TrainingJob.AlreadyInitialized.selector);
        vm.prank(outsider);
        implementation.initialize(s, outsider, INodeRegistry(address(registry)));
        assertEq(address(implementation.registry()), address(1), "template stays locked");
    }

    function test_initialize_revertsNotFactory_onFreshClone() public {
        // A clone that is not the factory's: initialising it from a non-factory fails.
        TrainingJob bare = TrainingJob(payable(_clone(address(implementation))));
        JobSpec memory s = _spec();
        vm.expectRevert(TrainingJob.NotFactory.selector);
        vm.prank(outsider);
        bare.initialize(s, outsider, INodeRegistry(address(registry)));
    }

    function test_initialize_withFakeRegistry_yieldsJobThatCannotSlash() public {
        // Anyone may initialise a clone of their own against a registry of their own; it still is no
        // factory job, so the real registry refuses its slashes.
        FakeRegistry fake = new FakeRegistry(outsider);
        TrainingJob rogue = TrainingJob(payable(_clone(address(implementation))));
        JobSpec memory s = _spec();
        vm.prank(outsider);
        rogue.initialize(s, outsider, INodeRegistry(address(fake)));
        assertFalse(factory.isJob(address(rogue)), "not a factory job");
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, address(rogue)));
        vm.prank(address(rogue));
        registry.slash(worker, 1, outsider, "x");
    }

    // ------------------------------------------------------------------ fuzz

    function testFuzz_createJob_budgetAgainstLeaseCost(uint256 reward, uint32 group, uint32 tasks, uint256 budget)
        public
    {
        JobSpec memory s = _spec();
        s.rewardPerSample = bound(reward, 1, 1 ether);
        s.groupSize = uint32(bound(group, 1, 64));
        s.tasksPerLease = uint32(bound(tasks, 1, 64));
        uint256 cost = _cost(s);
        budget = bound(budget, 0, 500 ether);
        if (budget < cost) {
            vm.expectRevert(abi.encodeWithSelector(JobFactory.BudgetTooSmall.selector, budget, cost));
            vm.prank(requester);
            factory.createJob{value: budget}(s);
            assertEq(factory.jobCount(), 0, "no job");
        } else {
            TrainingJob j = _createJob(s, budget);
            assertEq(j.escrow(), budget, "escrow");
            assertEq(j.leaseCost(), cost, "leaseCost");
            assertEq(address(j).balance, budget, "balance");
        }
    }

    function testFuzz_createJob_timelineBound(uint64 lease, uint64 vote, uint64 chal, uint64 res) public {
        JobSpec memory s = _spec();
        s.leaseDuration = uint64(bound(lease, 1, 4 days));
        s.voteWindow = uint64(bound(vote, 1, 4 days));
        s.challengeWindow = uint64(bound(chal, 1, 4 days));
        s.resolveWindow = uint64(bound(res, 1, 4 days));
        uint256 timeline = uint256(s.leaseDuration) + s.voteWindow + s.challengeWindow + s.resolveWindow;
        if (timeline >= UNBONDING) {
            vm.expectRevert(abi.encodeWithSelector(JobFactory.TimelineTooLong.selector, timeline, UNBONDING));
            vm.prank(requester);
            factory.createJob{value: 1 ether}(s);
            assertEq(factory.jobCount(), 0, "no job");
        } else {
            TrainingJob j = _createJob(s, 1 ether);
            assertTrue(factory.isJob(address(j)), "created");
        }
    }

    // ------------------------------------------------------------------ helpers

    function _expectInvalid(JobSpec memory s, string memory field) internal {
        vm.expectRevert(abi.encodeWithSelector(JobFactory.InvalidSpec.selector, field));
        vm.prank(requester);
        factory.createJob{value: 1 ether}(s);
    }

    /// @dev Address of the contract `deployer` creates with CREATE at `nonce` (nonce < 128).
    function _createAddress(address deployer, uint8 nonce) internal pure returns (address) {
        return address(uint160(uint256(keccak256(abi.encodePacked(bytes1(0xd6), bytes1(0x94), deployer, nonce)))));
    }

    /// @dev A bare EIP-1167 clone of `target`, made outside the factory.
    function _clone(address target) internal returns (address c) {
        bytes memory code = abi.encodePacked(
            hex"3d602d80600a3d3981f3363d3d373d3d3d363d73", target, hex"5af43d82803e903d91602b57fd5bf3"
        );
        assembly {
            c := create(0, add(code, 0x20), mload(code))
        }
        require(c != address(0), "clone failed");
    }
}
