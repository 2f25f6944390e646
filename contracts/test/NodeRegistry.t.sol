// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Fixture} from "./Fixture.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {JobSpec} from "../src/Interfaces.sol";

/// @notice A contract that is not a factory-made job, trying to slash.
contract RogueSlasher {
    function hit(NodeRegistry r, address node, uint256 amount) external returns (uint256) {
        return r.slash(node, amount, address(this), "rogue");
    }
}

/// @notice A factory stand-in that calls itself a job factory and vouches for every caller.
contract LyingFactory {
    function isJob(address) external pure returns (bool) {
        return true;
    }
}

/// @title NodeRegistryTest
/// @notice Every external function of NodeRegistry: success, each failure, events, and fuzzed amounts/timing.
contract NodeRegistryTest is Fixture {
    bytes internal constant PEER_A = hex"0024080112201111";
    bytes internal constant PEER_B = hex"0024080112202222";

    function setUp() public {
        _deploy();
    }

    // ------------------------------------------------------------------ constructor / views

    function test_constructor_setsParametersAndDeployer() public view {
        assertEq(registry.minWorkerStake(), MIN_WORKER, "minWorkerStake");
        assertEq(registry.minValidatorStake(), MIN_VALIDATOR, "minValidatorStake");
        assertEq(uint256(registry.unbondingPeriod()), uint256(UNBONDING), "unbondingPeriod");
        assertEq(registry.deployer(), address(this), "deployer");
        assertEq(registry.factory(), address(factory), "factory");
    }

    function test_minStakeFor_takesLargestMinimumOfRoles() public view {
        assertEq(registry.minStakeFor(WORKER), MIN_WORKER, "worker");
        assertEq(registry.minStakeFor(VALIDATOR), MIN_VALIDATOR, "validator");
        assertEq(registry.minStakeFor(BOTH), MIN_VALIDATOR, "both");
        assertEq(registry.minStakeFor(0), 0, "none");
    }

    // ------------------------------------------------------------------ join

    function test_join_worker_recordsNodeAndStake() public {
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.NodeJoined(worker, PEER_A, WORKER, MIN_WORKER);
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(PEER_A, WORKER);

        (bytes memory peer, uint8 roles, uint256 active, uint256 unbonding, uint64 readyAt) = registry.nodeInfo(worker);
        assertEq(peer, PEER_A, "peerId");
        assertEq(uint256(roles), uint256(WORKER), "roles");
        assertEq(active, MIN_WORKER, "active");
        assertEq(unbonding, 0, "unbonding");
        assertEq(uint256(readyAt), 0, "readyAt");
        assertEq(registry.ownerOfPeer(PEER_A), worker, "ownerOfPeer");
        assertEq(registry.peerOwner(keccak256(PEER_A)), worker, "peerOwner");
        assertEq(registry.totalActive(), MIN_WORKER, "totalActive");
        assertEq(address(registry).balance, MIN_WORKER, "balance");
        assertTrue(registry.isActive(worker, WORKER), "active worker");
        assertFalse(registry.isActive(worker, VALIDATOR), "not a validator");
    }

    function test_join_validator_needsValidatorMinimum() public {
        vm.prank(v1);
        registry.join{value: MIN_VALIDATOR}(PEER_A, VALIDATOR);
        assertTrue(registry.isActive(v1, VALIDATOR), "validator active");
        assertFalse(registry.isActive(v1, WORKER), "validator is not a worker");
    }

    function test_join_bothRoles_activeInEach() public {
        vm.prank(v1);
        registry.join{value: MIN_VALIDATOR}(PEER_A, BOTH);
        assertTrue(registry.isActive(v1, WORKER), "worker role");
        assertTrue(registry.isActive(v1, VALIDATOR), "validator role");
    }

    function test_join_revertsInvalidRoles_zero() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, uint8(0)));
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(PEER_A, 0);
    }

    function test_join_revertsInvalidRoles_unknownBit() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, uint8(4)));
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(PEER_A, 4);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, uint8(7)));
        vm.prank(worker);
        registry.join{value: MIN_VALIDATOR}(PEER_A, 7);
    }

    function test_join_revertsEmptyPeerId() public {
        vm.expectRevert(NodeRegistry.EmptyPeerId.selector);
        vm.prank(worker);
        registry.join{value: MIN_WORKER}("", WORKER);
    }

    function test_join_revertsPeerIdTaken_namingOwner() public {
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(PEER_A, WORKER);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.PeerIdTaken.selector, worker));
        vm.prank(worker2);
        registry.join{value: MIN_WORKER}(PEER_A, WORKER);
    }

    function test_join_revertsAlreadyRegistered() public {
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(PEER_A, WORKER);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.AlreadyRegistered.selector, worker));
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(PEER_B, WORKER);
    }

    function test_join_revertsStakeBelowMinimum_namingWorkerMinimum() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.StakeBelowMinimum.selector, MIN_WORKER, MIN_WORKER - 1));
        vm.prank(worker);
        registry.join{value: MIN_WORKER - 1}(PEER_A, WORKER);
    }

    function test_join_revertsStakeBelowMinimum_namingValidatorMinimumForBothRoles() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.StakeBelowMinimum.selector, MIN_VALIDATOR, MIN_WORKER));
        vm.prank(v1);
        registry.join{value: MIN_WORKER}(PEER_A, BOTH);
    }

    // ------------------------------------------------------------------ setPeerId

    function test_setPeerId_rebindsAndFreesOldId() public {
        _joinA(worker);
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.PeerIdChanged(worker, PEER_B);
        vm.prank(worker);
        registry.setPeerId(PEER_B);
        assertEq(registry.ownerOfPeer(PEER_B), worker, "new id bound");
        assertEq(registry.ownerOfPeer(PEER_A), address(0), "old id freed");
        (bytes memory peer,,,,) = registry.nodeInfo(worker);
        assertEq(peer, PEER_B, "stored id");
        // The freed id can be taken by someone else.
        vm.prank(worker2);
        registry.join{value: MIN_WORKER}(PEER_A, WORKER);
        assertEq(registry.ownerOfPeer(PEER_A), worker2, "old id reusable");
    }

    function test_setAddrs_storesAndEmits() public {
        _joinA(worker);
        bytes memory addrs = bytes("/ip4/127.0.0.1/tcp/4001\n/ip4/127.0.0.1/udp/4001/quic-v1");
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.AddrsSet(worker, addrs);
        vm.prank(worker);
        registry.setAddrs(addrs);
        assertEq(registry.listenAddrs(worker), addrs, "stored");
        vm.prank(worker);
        registry.setAddrs("");
        assertEq(registry.listenAddrs(worker), bytes(""), "withdrawn");
    }

    function test_setAddrs_revertsNotRegistered() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotRegistered.selector, worker));
        vm.prank(worker);
        registry.setAddrs("/ip4/127.0.0.1/tcp/1");
    }

    function test_setAddrs_revertsAddrsTooLong() public {
        _joinA(worker);
        bytes memory tooLong = new bytes(513);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.AddrsTooLong.selector, 513, 512));
        vm.prank(worker);
        registry.setAddrs(tooLong);
        vm.prank(worker);
        registry.setAddrs(new bytes(512));
        assertEq(registry.listenAddrs(worker).length, 512, "the maximum fits");
    }

    function test_setPeerId_revertsNotRegistered() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotRegistered.selector, worker));
        vm.prank(worker);
        registry.setPeerId(PEER_B);
    }

    function test_setPeerId_revertsEmptyPeerId() public {
        _joinA(worker);
        vm.expectRevert(NodeRegistry.EmptyPeerId.selector);
        vm.prank(worker);
        registry.setPeerId("");
    }

    function test_setPeerId_revertsPeerIdTaken_byOtherNode() public {
        _joinA(worker);
        vm.prank(worker2);
        registry.join{value: MIN_WORKER}(PEER_B, WORKER);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.PeerIdTaken.selector, worker2));
        vm.prank(worker);
        registry.setPeerId(PEER_B);
    }

    // ------------------------------------------------------------------ addStake

    function test_addStake_increasesActiveAndTotal() public {
        _joinA(worker);
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.StakeAdded(worker, 3 ether, MIN_WORKER + 3 ether);
        vm.prank(worker);
        registry.addStake{value: 3 ether}();
        assertEq(_active(worker), MIN_WORKER + 3 ether, "active");
        assertEq(registry.totalActive(), MIN_WORKER + 3 ether, "totalActive");
        _assertRegistrySolvent();
    }

    function test_addStake_revertsNotRegistered() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotRegistered.selector, worker));
        vm.prank(worker);
        registry.addStake{value: 1 ether}();
    }

    function test_addStake_revertsZeroAmount() public {
        _joinA(worker);
        vm.expectRevert(NodeRegistry.ZeroAmount.selector);
        vm.prank(worker);
        registry.addStake{value: 0}();
    }

    // ------------------------------------------------------------------ requestUnbond

    function test_requestUnbond_movesStakeAndSetsReadyAt() public {
        _joinA(worker);
        vm.prank(worker);
        registry.addStake{value: 1 ether}();
        vm.warp(1000);
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.UnbondRequested(worker, 0.5 ether, 1000 + UNBONDING);
        vm.prank(worker);
        registry.requestUnbond(0.5 ether);
        (,, uint256 active, uint256 unbonding, uint64 readyAt) = registry.nodeInfo(worker);
        assertEq(active, 1.5 ether, "active");
        assertEq(unbonding, 0.5 ether, "unbonding");
        assertEq(uint256(readyAt), 1000 + uint256(UNBONDING), "readyAt");
        assertEq(registry.totalActive(), 1.5 ether, "totalActive");
        assertEq(registry.totalUnbonding(), 0.5 ether, "totalUnbonding");
        _assertRegistrySolvent();
    }

    function test_requestUnbond_laterRequestResetsReadyAtForWholeBalance() public {
        _joinA(worker);
        vm.prank(worker);
        registry.addStake{value: 1 ether}();
        vm.warp(1000);
        vm.prank(worker);
        registry.requestUnbond(0.5 ether);
        vm.warp(1000 + 3 days);
        vm.prank(worker);
        registry.requestUnbond(0.25 ether);
        (,,, uint256 unbonding, uint64 readyAt) = registry.nodeInfo(worker);
        assertEq(unbonding, 0.75 ether, "unbonding accumulates");
        assertEq(uint256(readyAt), 1000 + 3 days + uint256(UNBONDING), "readyAt from latest request");
        vm.warp(1000 + uint256(UNBONDING));
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, readyAt));
        vm.prank(worker);
        registry.withdraw();
    }

    function test_requestUnbond_belowMinimum_deactivates() public {
        _joinA(worker);
        vm.prank(worker);
        registry.requestUnbond(1);
        assertFalse(registry.isActive(worker, WORKER), "below minimum is inactive");
    }

    function test_requestUnbond_revertsInsufficientActiveStake() public {
        _joinA(worker);
        vm.expectRevert(
            abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, MIN_WORKER + 1, MIN_WORKER)
        );
        vm.prank(worker);
        registry.requestUnbond(MIN_WORKER + 1);
    }

    function test_requestUnbond_revertsZeroAmount() public {
        _joinA(worker);
        vm.expectRevert(NodeRegistry.ZeroAmount.selector);
        vm.prank(worker);
        registry.requestUnbond(0);
    }

    function test_requestUnbond_revertsNotRegistered() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotRegistered.selector, worker));
        vm.prank(worker);
        registry.requestUnbond(1);
    }

    // ------------------------------------------------------------------ withdraw

    function test_withdraw_revertsUnbondingNotFinished_early() public {
        _joinA(worker);
        vm.warp(100);
        vm.prank(worker);
        registry.requestUnbond(MIN_WORKER);
        vm.warp(100 + uint256(UNBONDING) - 1);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, uint64(100) + UNBONDING));
        vm.prank(worker);
        registry.withdraw();
    }

    function test_withdraw_paysOutAfterPeriod() public {
        _joinA(worker);
        vm.warp(100);
        vm.prank(worker);
        registry.requestUnbond(MIN_WORKER);
        vm.warp(100 + uint256(UNBONDING));
        uint256 before = worker.balance;
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.Withdrawn(worker, MIN_WORKER);
        vm.prank(worker);
        registry.withdraw();
        assertEq(worker.balance, before + MIN_WORKER, "paid out");
        assertEq(_unbonding(worker), 0, "unbonding cleared");
        assertEq(registry.totalUnbonding(), 0, "totalUnbonding");
        assertEq(address(registry).balance, 0, "registry empty");
        _assertRegistrySolvent();
    }

    function test_withdraw_revertsNothingToWithdraw_neverUnbonded() public {
        _joinA(worker);
        vm.expectRevert(NodeRegistry.NothingToWithdraw.selector);
        vm.prank(worker);
        registry.withdraw();
    }

    function test_withdraw_revertsNothingToWithdraw_secondTime() public {
        _joinA(worker);
        vm.prank(worker);
        registry.requestUnbond(MIN_WORKER);
        vm.warp(block.timestamp + UNBONDING);
        vm.prank(worker);
        registry.withdraw();
        vm.expectRevert(NodeRegistry.NothingToWithdraw.selector);
        vm.prank(worker);
        registry.withdraw();
    }

    function test_withdraw_revertsTransferFailed_whenRecipientRejects() public {
        Rejector r = new Rejector();
        vm.deal(address(r), 10 ether);
        r.joinAndUnbond{value: 0}(registry, MIN_WORKER);
        vm.warp(block.timestamp + UNBONDING);
        vm.expectRevert(NodeRegistry.TransferFailed.selector);
        r.withdraw(registry);
        assertEq(_unbonding(address(r)), MIN_WORKER, "stake kept on failed transfer");
    }

    // ------------------------------------------------------------------ setFactory

    function test_setFactory_revertsNotDeployer() public {
        NodeRegistry fresh = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        vm.expectRevert(NodeRegistry.NotDeployer.selector);
        vm.prank(outsider);
        fresh.setFactory(address(factory));
    }

    function test_setFactory_revertsFactoryAlreadySet() public {
        vm.expectRevert(NodeRegistry.FactoryAlreadySet.selector);
        registry.setFactory(address(0xBEEF));
    }

    function test_setFactory_revertsZeroAddress() public {
        NodeRegistry fresh = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        vm.expectRevert(NodeRegistry.ZeroAddress.selector);
        fresh.setFactory(address(0));
    }

    function test_setFactory_setsOnceAndEmits() public {
        NodeRegistry fresh = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        vm.expectEmit(false, false, false, true, address(fresh));
        emit NodeRegistry.FactorySet(address(0xBEEF));
        fresh.setFactory(address(0xBEEF));
        assertEq(fresh.factory(), address(0xBEEF), "factory");
    }

    // ------------------------------------------------------------------ slash

    function test_slash_revertsNotAuthorizedSlasher_fromEOA() public {
        _joinA(worker);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, outsider));
        vm.prank(outsider);
        registry.slash(worker, 1 ether, outsider, "x");
    }

    function test_slash_revertsNotAuthorizedSlasher_fromContractNotMadeByFactory() public {
        _joinA(worker);
        RogueSlasher rogue = new RogueSlasher();
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, address(rogue)));
        rogue.hit(registry, worker, 1 ether);
        assertEq(_active(worker), MIN_WORKER, "stake untouched");
    }

    function test_slash_revertsNotAuthorizedSlasher_fromTemplateImplementation() public {
        // The clone template is a TrainingJob, but not one the factory made.
        _joinA(worker);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, address(implementation)));
        vm.prank(address(implementation));
        registry.slash(worker, 1 ether, outsider, "x");
    }

    function test_slash_revertsNotAuthorizedSlasher_beforeFactorySet() public {
        NodeRegistry fresh = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, outsider));
        vm.prank(outsider);
        fresh.slash(worker, 1, outsider, "x");
    }

    function test_slash_byFactoryJob_takesActiveAndPaysBeneficiary() public {
        _joinStake(worker, 3 ether);
        address job = _factoryJob();
        uint256 before = outsider.balance;
        vm.expectEmit(true, true, false, true, address(registry));
        emit NodeRegistry.Slashed(worker, job, 1 ether, outsider, "reason");
        vm.prank(job);
        uint256 taken = registry.slash(worker, 1 ether, outsider, "reason");
        assertEq(taken, 1 ether, "taken");
        assertEq(_active(worker), 2 ether, "active");
        assertEq(outsider.balance, before + 1 ether, "beneficiary paid");
        _assertRegistrySolvent();
    }

    function test_slash_reachesUnbondingStake() public {
        _joinStake(worker, 3 ether);
        vm.prank(worker);
        registry.requestUnbond(2.5 ether);
        address job = _factoryJob();
        vm.prank(job);
        uint256 taken = registry.slash(worker, 1 ether, outsider, "reason");
        assertEq(taken, 1 ether, "taken");
        assertEq(_active(worker), 0, "active drained first");
        assertEq(_unbonding(worker), 2 ether, "rest from unbonding");
        assertEq(registry.totalActive(), 0, "totalActive");
        assertEq(registry.totalUnbonding(), 2 ether, "totalUnbonding");
        _assertRegistrySolvent();
    }

    function test_slash_capsAtWhatNodeHolds() public {
        _joinStake(worker, 3 ether);
        vm.prank(worker);
        registry.requestUnbond(1 ether);
        address job = _factoryJob();
        uint256 before = outsider.balance;
        vm.prank(job);
        uint256 taken = registry.slash(worker, 100 ether, outsider, "reason");
        assertEq(taken, 3 ether, "capped at active+unbonding");
        assertEq(_active(worker), 0, "active");
        assertEq(_unbonding(worker), 0, "unbonding");
        assertEq(outsider.balance, before + 3 ether, "beneficiary");
        assertFalse(registry.isActive(worker, WORKER), "slashed out");
        _assertRegistrySolvent();
    }

    function test_slash_unknownNode_takesNothing() public {
        address job = _factoryJob();
        uint256 before = outsider.balance;
        vm.prank(job);
        uint256 taken = registry.slash(worker, 1 ether, outsider, "reason");
        assertEq(taken, 0, "nothing to take");
        assertEq(outsider.balance, before, "no transfer");
    }

    function test_slash_revertsZeroAddressBeneficiary() public {
        _joinA(worker);
        address job = _factoryJob();
        vm.expectRevert(NodeRegistry.ZeroAddress.selector);
        vm.prank(job);
        registry.slash(worker, 1 ether, address(0), "reason");
    }

    function test_slash_lyingFactoryOnOtherRegistry_cannotTouchThisRegistry() public {
        // A registry is bound to its own factory; a lying factory elsewhere vouches for nothing here.
        _joinA(worker);
        NodeRegistry other = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        other.setFactory(address(new LyingFactory()));
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, address(other)));
        vm.prank(address(other));
        registry.slash(worker, 1 ether, outsider, "x");
    }

    // ------------------------------------------------------------------ isActive

    function test_isActive_thresholds() public {
        vm.prank(v1);
        registry.join{value: MIN_VALIDATOR}(PEER_A, BOTH);
        assertTrue(registry.isActive(v1, VALIDATOR), "validator at minimum");
        vm.prank(v1);
        registry.requestUnbond(1);
        assertFalse(registry.isActive(v1, VALIDATOR), "validator one wei below");
        assertTrue(registry.isActive(v1, WORKER), "still above worker minimum");
        vm.prank(v1);
        registry.requestUnbond(MIN_VALIDATOR - MIN_WORKER - 1);
        assertEq(_active(v1), MIN_WORKER, "at worker minimum");
        assertTrue(registry.isActive(v1, WORKER), "worker at minimum");
        vm.prank(v1);
        registry.requestUnbond(1);
        assertFalse(registry.isActive(v1, WORKER), "worker one wei below");
        vm.prank(v1);
        registry.addStake{value: MIN_VALIDATOR}();
        assertTrue(registry.isActive(v1, VALIDATOR), "restaked");
        assertFalse(registry.isActive(outsider, WORKER), "unregistered");
    }

    // ------------------------------------------------------------------ fuzz

    function testFuzz_joinStakeUnbond_accountingHolds(uint256 stake, uint256 extra, uint256 unbond) public {
        stake = bound(stake, MIN_WORKER, 500 ether);
        extra = bound(extra, 1, 400 ether);
        vm.prank(worker);
        registry.join{value: stake}(PEER_A, WORKER);
        vm.prank(worker);
        registry.addStake{value: extra}();
        uint256 total = stake + extra;
        unbond = bound(unbond, 1, total);
        vm.prank(worker);
        registry.requestUnbond(unbond);
        assertEq(_active(worker), total - unbond, "active");
        assertEq(_unbonding(worker), unbond, "unbonding");
        assertEq(registry.isActive(worker, WORKER), total - unbond >= MIN_WORKER, "isActive matches threshold");
        _assertRegistrySolvent();
    }

    function testFuzz_requestUnbond_revertsAboveActive(uint256 stake, uint256 over) public {
        stake = bound(stake, MIN_WORKER, 500 ether);
        over = bound(over, 1, type(uint128).max);
        vm.prank(worker);
        registry.join{value: stake}(PEER_A, WORKER);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, stake + over, stake));
        vm.prank(worker);
        registry.requestUnbond(stake + over);
    }

    function testFuzz_join_belowMinimumReverts(uint256 stake) public {
        stake = bound(stake, 0, MIN_WORKER - 1);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.StakeBelowMinimum.selector, MIN_WORKER, stake));
        vm.prank(worker);
        registry.join{value: stake}(PEER_A, WORKER);
    }

    function testFuzz_withdraw_timingAroundUnbondingBoundary(uint256 start, uint256 wait) public {
        start = bound(start, 1, 365 days * 50);
        wait = bound(wait, 0, 2 * uint256(UNBONDING));
        _joinA(worker);
        vm.warp(start);
        vm.prank(worker);
        registry.requestUnbond(MIN_WORKER);
        vm.warp(start + wait);
        if (wait < UNBONDING) {
            vm.expectRevert(
                abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, uint64(start) + UNBONDING)
            );
            vm.prank(worker);
            registry.withdraw();
            assertEq(_unbonding(worker), MIN_WORKER, "still unbonding");
        } else {
            uint256 before = worker.balance;
            vm.prank(worker);
            registry.withdraw();
            assertEq(worker.balance, before + MIN_WORKER, "withdrawn");
        }
        _assertRegistrySolvent();
    }

    function testFuzz_slash_takesMinOfAmountAndHoldings(uint256 stake, uint256 unbond, uint256 amount) public {
        stake = bound(stake, MIN_WORKER, 100 ether);
        unbond = bound(unbond, 0, stake);
        amount = bound(amount, 0, 300 ether);
        _joinStake(worker, stake);
        if (unbond > 0) {
            vm.prank(worker);
            registry.requestUnbond(unbond);
        }
        address job = _factoryJob();
        vm.prank(job);
        uint256 taken = registry.slash(worker, amount, outsider, "fuzz");
        uint256 expected = amount < stake ? amount : stake;
        assertEq(taken, expected, "taken");
        uint256 activeBefore = stake - unbond;
        uint256 fromActive = amount < activeBefore ? amount : activeBefore;
        assertEq(_active(worker), activeBefore - fromActive, "active first");
        assertEq(_unbonding(worker), unbond - (expected - fromActive), "then unbonding");
        _assertRegistrySolvent();
    }

    // ------------------------------------------------------------------ helpers

    function _joinA(address who) internal {
        vm.prank(who);
        registry.join{value: MIN_WORKER}(PEER_A, WORKER);
    }

    function _joinStake(address who, uint256 stake) internal {
        vm.prank(who);
        registry.join{value: stake}(PEER_A, WORKER);
    }

    /// @dev A real factory-made job, used as the msg.sender of slash calls.
    function _factoryJob() internal returns (address) {
        JobSpec memory s = _spec();
        return address(_createJob(s, _cost(s)));
    }
}

/// @notice A node whose address refuses ether, to exercise the registry's failed-transfer path.
contract Rejector {
    function joinAndUnbond(NodeRegistry r, uint256 stake) external payable {
        r.join{value: stake}(hex"0024beef", 1);
        r.requestUnbond(stake);
    }

    function withdraw(NodeRegistry r) external {
        r.withdraw();
    }

    receive() external payable {
        revert("no thanks");
    }
}
