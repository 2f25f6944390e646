// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Helpers} from "./Helpers.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {JobSpec} from "../src/Interfaces.sol";

/// @title TrainingJobTest
/// @notice The lease lifecycle of one job: policy clock, claim (collateral), drawSeed, reclaim, submit,
///         committees, votes, early and late decisions, appeals, finalize, settlement, slashLoser,
///         penalizeAbsent, claimReward, withdrawPayment, close and receive; fuzzed timing, votes and stakes.
/// @dev Fixture spec: 4 x 2 completions at 0.001 ether (lease cost 0.008), staleness 2, committee 3, two
///      appeals, lease and vote windows 1 h, appeal window 1 d, slash 0.5, expiry fee 0.05, voter slash 1,
///      absent penalty 0.1, bond 0.2. Three validators of 5 ether: with k * w >= W every one of them sits on
///      every committee with weight 5 (of 15), so two matching votes decide a round early. The three
///      validators enlist in `job` in setUp (before any round starts), so they answer for absence there;
///      the enlistment tests use fresh jobs.
contract TrainingJobTest is Helpers {
    uint256 internal constant STAKE = 5 ether;
    uint256 internal constant BUDGET = 1 ether;
    uint256 internal constant T0 = 1_700_000_000;

    JobSpec internal s;
    TrainingJob internal job;
    uint256 internal cost;
    address[] internal vals;

    function setUp() public {
        _deploy();
        vm.warp(T0);
        vm.roll(100);
        _join(worker, WORKER, STAKE);
        _join(worker2, WORKER, STAKE);
        _join(v1, VALIDATOR, STAKE);
        _join(v2, VALIDATOR, STAKE);
        _join(v3, VALIDATOR, STAKE);
        _roll(1);
        s = _spec();
        job = _createJob(s, BUDGET);
        cost = _cost(s);
        vals.push(v1);
        vals.push(v2);
        vals.push(v3);
        for (uint256 i = 0; i < vals.length; ++i) {
            _enlist(job, vals[i]);
        }
    }

    // ------------------------------------------------------------------ helpers

    function _solvent() internal view {
        _assertJobSolvent(job);
        _assertRegistrySolvent();
    }

    function _open() internal returns (uint256 id) {
        id = _submitted(job, worker, 0);
    }

    function _acceptEarly(uint256 id) internal {
        _vote(job, v1, id, true);
        _vote(job, v2, id, true);
    }

    function _rejectEarly(uint256 id) internal {
        _vote(job, v2, id, false);
        _vote(job, v3, id, false);
    }

    function _afterDeadline(uint256 id) internal {
        vm.warp(uint256(_deadline(job, id)) + 1);
    }

    function _finalizeNow(uint256 id) internal {
        _afterDeadline(id);
        job.finalize(id);
    }

    function _round(uint256 id, uint256 r) internal view returns (TrainingJob.Round memory rd) {
        (rd,) = job.getRound(id, r);
    }

    /// @dev The trainer publishes every version up to `target`.
    function _publishTo(uint64 target) internal {
        for (uint64 v = job.currentVersion() + 1; v <= target; ++v) {
            vm.prank(trainer);
            job.publishPolicy(v, bytes32(uint256(v)));
        }
    }

    function _pending(uint256 id) internal view returns (uint256 p) {
        (p,,) = job.disputes(id);
    }

    function _voterPool(uint256 id) internal view returns (uint256 p) {
        (, p,) = job.disputes(id);
    }

    function _appellantPool(uint256 id) internal view returns (uint256 p) {
        (,, p) = job.disputes(id);
    }

    // ================================================================== full path

    function test_fullPath_acceptedLeasePaysWorkerAndReleasesCollateral() public {
        uint256 id = _claimReady(job, worker);
        assertEq(_locked(worker), s.slashAmount, "collateral locked");
        assertEq(job.reserved(), cost, "reserved");
        _submit(job, worker, id, 0);
        _vote(job, v1, id, true);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Voting), "one vote of three is no majority");
        _vote(job, v2, id, true);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Decided), "decided early");
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Accept), "accepted");
        assertEq(uint256(_deadline(job, id)), block.timestamp + s.appealWindow, "appeal deadline");

        _afterDeadline(id);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Settled(id, worker, TrainingJob.Outcome.Accept, cost);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "paid");
        assertEq(job.owed(worker), cost, "owed");
        assertEq(job.escrow(), BUDGET - cost, "escrow spent");
        assertEq(job.reserved(), 0, "reservation released");
        assertEq(_locked(worker), 0, "collateral released");
        assertEq(_active(worker), STAKE, "stake whole");
        _solvent();

        uint256 before = worker.balance;
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.PaymentWithdrawn(worker, cost);
        vm.prank(worker);
        job.withdrawPayment();
        assertEq(worker.balance, before + cost, "worker paid");
        assertEq(job.totalOwed(), 0, "nothing owed");
        assertEq(job.burned(), 0, "nothing burned");
        _solvent();
    }

    // ================================================================== publishPolicy

    function test_publishPolicy_onlyNextVersion() public {
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.PolicyPublished(1, bytes32(uint256(11)));
        vm.prank(trainer);
        job.publishPolicy(1, bytes32(uint256(11)));
        vm.prank(trainer);
        job.publishPolicy(2, bytes32(uint256(22)));
        uint64[4] memory bad = [uint64(4), 3 + 1000, 2, 1];
        for (uint256 i = 0; i < bad.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotNext.selector, uint64(2), bad[i]));
            vm.prank(trainer);
            job.publishPolicy(bad[i], bytes32(uint256(99)));
        }
        assertEq(uint256(job.currentVersion()), 2, "clock at 2");
        assertEq(job.policyRoot(1), bytes32(uint256(11)), "root 1");
        assertEq(job.policyRoot(2), bytes32(uint256(22)), "root 2");
        assertEq(job.policyRoot(4), bytes32(0), "nothing at 4");
        assertEq(job.policyRoot(0), s.modelHash, "base model");
        _solvent();
    }

    function test_publishPolicy_revertsNotTrainerAndEmptyRoot() public {
        address[3] memory others = [requester, worker, v1];
        for (uint256 i = 0; i < others.length; ++i) {
            vm.expectRevert(TrainingJob.NotTrainer.selector);
            vm.prank(others[i]);
            job.publishPolicy(1, bytes32(uint256(1)));
        }
        vm.expectRevert(TrainingJob.EmptyRoot.selector);
        vm.prank(trainer);
        job.publishPolicy(1, bytes32(0));
        assertEq(uint256(job.currentVersion()), 0, "unchanged");
        _solvent();
    }

    function test_publishPolicy_uint64MaxRefused() public {
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotNext.selector, uint64(0), type(uint64).max));
        vm.prank(trainer);
        job.publishPolicy(type(uint64).max, bytes32(uint256(1)));
        assertEq(uint256(job.currentVersion()), 0, "clock did not jump");
        _solvent();
    }

    function testFuzz_publishPolicy_onlyCurrentPlusOne(uint8 steps, uint64 v) public {
        steps = uint8(bound(steps, 0, 5));
        for (uint64 i = 1; i <= steps; ++i) {
            vm.prank(trainer);
            job.publishPolicy(i, bytes32(uint256(i)));
        }
        vm.prank(trainer);
        if (v == uint64(steps) + 1) {
            job.publishPolicy(v, bytes32(uint256(7)));
            assertEq(uint256(job.currentVersion()), uint256(steps) + 1, "advanced by one");
        } else {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotNext.selector, uint64(steps), v));
            job.publishPolicy(v, bytes32(uint256(7)));
            assertEq(uint256(job.currentVersion()), steps, "unchanged");
        }
        _solvent();
    }

    // ================================================================== claim

    function test_claim_locksCollateralReservesAndEmits() public {
        uint64 expiresAt = uint64(block.timestamp) + s.leaseDuration;
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.TaskClaimed(1, worker, 0, s.tasksPerLease, uint64(block.number), expiresAt);
        uint256 id = _claim(job, worker);
        assertEq(id, 1, "first id");
        TrainingJob.Lease memory l = job.getLease(id);
        assertEq(l.worker, worker, "worker");
        assertEq(uint256(l.status), uint256(TrainingJob.Status.Leased), "leased");
        assertEq(uint256(l.firstTask), 0, "first task");
        assertEq(uint256(l.deadline), expiresAt, "deadline");
        assertEq(uint256(l.anchorBlock), block.number, "claim block");
        assertEq(l.seed, bytes32(0), "seed not known in the claim transaction");
        assertEq(job.reserved(), cost, "reserved");
        assertEq(job.escrow(), BUDGET, "escrow intact");
        assertEq(uint256(job.nextTask()), s.tasksPerLease, "nextTask");
        assertEq(_locked(worker), s.slashAmount, "locked");
        assertEq(_active(worker), STAKE - s.slashAmount, "free stake reduced");
        uint256 id2 = _claim(job, worker2);
        assertEq(uint256(job.getLease(id2).firstTask), s.tasksPerLease, "next tasks");
        assertEq(job.reserved(), 2 * cost, "two reservations");
        _solvent();
    }

    function test_claim_revertsInsufficientEscrow() public {
        TrainingJob small = _createJob(s, cost + cost / 2);
        _claim(small, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.InsufficientEscrow.selector, cost / 2, cost));
        vm.prank(worker2);
        small.claim();
        assertEq(small.reserved(), cost, "one reservation");
        assertEq(_locked(worker2), 0, "no collateral locked");
        _solvent();
    }

    function test_claim_revertsJobClosed() public {
        vm.prank(requester);
        job.close();
        vm.expectRevert(TrainingJob.JobClosed.selector);
        vm.prank(worker);
        job.claim();
        assertEq(job.leaseCount(), 0, "no lease");
        _solvent();
    }

    function test_claim_revertsNotActiveForNonWorkers() public {
        _join(trainer, TRAINER_ROLE, 0);
        address[3] memory nonWorkers = [v1, outsider, trainer];
        for (uint256 i = 0; i < nonWorkers.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, nonWorkers[i], WORKER));
            vm.prank(nonWorkers[i]);
            job.claim();
        }
        // A worker that unbonded below the minimum is no longer active.
        vm.prank(worker2);
        registry.requestUnbond(STAKE - MIN_WORKER + 1);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, worker2, WORKER));
        vm.prank(worker2);
        job.claim();
        assertEq(job.leaseCount(), 0, "no lease");
        assertEq(job.reserved(), 0, "no reservation");
        _solvent();
    }

    function test_claim_revertsInsufficientActiveStake() public {
        address w3 = makeAddr("w3");
        vm.deal(w3, 10 ether);
        _join(w3, WORKER, 1.2 ether);
        _claim(job, w3);
        _claim(job, w3);
        assertEq(_active(w3), 0.2 ether, "0.2 free");
        assertEq(_locked(w3), 1 ether, "two collaterals locked");
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, s.slashAmount, 0.2 ether));
        vm.prank(w3);
        job.claim();
        assertEq(job.reserved(), 2 * cost, "the failed claim reserved nothing");
        assertEq(job.leaseCount(), 2, "two leases");
        _solvent();
    }

    function testFuzz_claim_leasesBoundedByFreeStake(uint256 stake) public {
        stake = bound(stake, MIN_WORKER, 10 ether);
        address w3 = makeAddr("w3");
        vm.deal(w3, stake);
        _join(w3, WORKER, stake);
        uint256 n = stake / s.slashAmount;
        for (uint256 i = 0; i < n; ++i) {
            _claim(job, w3);
        }
        assertEq(_locked(w3), n * s.slashAmount, "all collateral locked");
        vm.expectRevert(
            abi.encodeWithSelector(
                NodeRegistry.InsufficientActiveStake.selector, s.slashAmount, stake - n * s.slashAmount
            )
        );
        vm.prank(w3);
        job.claim();
        assertEq(job.reserved(), n * cost, "reservations match leases");
        _solvent();
    }

    // ================================================================== drawSeed

    function test_drawSeed_isClaimBlockHashDrawnLater() public {
        uint256 id = _claim(job, worker);
        uint256 claimBlock = block.number;
        _roll(1);
        bytes32 expected = keccak256(abi.encode(blockhash(claimBlock), address(job), id));
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.SeedDrawn(id, expected);
        vm.prank(outsider); // anyone may draw it
        job.drawSeed(id);
        assertEq(job.getLease(id).seed, expected, "seed");
        assertNotEq(expected, bytes32(0), "non-zero");
        _solvent();
    }

    function test_drawSeed_revertsInClaimBlock() public {
        uint256 id = _claim(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.RandomnessNotReady.selector, block.number));
        job.drawSeed(id);
        assertEq(job.getLease(id).seed, bytes32(0), "not drawn");
        _solvent();
    }

    function test_drawSeed_expiresAfter256Blocks() public {
        uint256 id = _claim(job, worker);
        uint256 claimBlock = block.number;
        uint256 snap = vmx.snapshotState();
        vm.roll(claimBlock + 256);
        job.drawSeed(id);
        assertNotEq(job.getLease(id).seed, bytes32(0), "drawable 256 blocks later");
        vmx.revertToState(snap);
        vm.roll(claimBlock + 257);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.RandomnessExpired.selector, claimBlock));
        job.drawSeed(id);
        // Such a lease can only expire.
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.SeedNotDrawn.selector, id));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        _solvent();
    }

    function test_drawSeed_revertsAlreadyDrawnWrongStatusUnknown() public {
        uint256 id = _claimReady(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.SeedAlreadyDrawn.selector, id));
        job.drawSeed(id);
        _submit(job, worker, id, 0);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Voting));
        job.drawSeed(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnknownLease.selector, 99));
        job.drawSeed(99);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnknownLease.selector, 0));
        job.drawSeed(0);
        _solvent();
    }

    // ================================================================== reclaim

    function test_reclaim_burnsFeeReleasesCollateralRequeues() public {
        uint256 id = _claim(job, worker);
        _afterDeadline(id);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.LeaseReturned(id, worker, 0, s.expiryFee);
        vm.prank(outsider); // anyone may reclaim
        job.reclaim(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Returned), "returned");
        assertEq(job.burned(), s.expiryFee, "fee burned");
        assertEq(address(job).balance, BUDGET + s.expiryFee, "fee held forever");
        assertEq(_locked(worker), 0, "collateral released");
        assertEq(_active(worker), STAKE - s.expiryFee, "minus the fee");
        assertEq(job.reserved(), 0, "reservation released");
        assertEq(job.escrow(), BUDGET, "escrow intact");
        uint256 again = _claim(job, worker2);
        assertEq(uint256(job.getLease(again).firstTask), 0, "tasks requeued");
        assertEq(uint256(job.nextTask()), s.tasksPerLease, "no fresh tasks used");
        _solvent();
    }

    function test_reclaim_revertsAtDeadlineAndWrongStatus() public {
        uint256 id = _claim(job, worker);
        uint64 deadline = _deadline(job, id);
        vm.warp(deadline);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, deadline));
        job.reclaim(id);
        vm.warp(deadline + 1);
        job.reclaim(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Returned));
        job.reclaim(id);
        uint256 sub = _open();
        vm.warp(block.timestamp + 10 days);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, sub, TrainingJob.Status.Voting));
        job.reclaim(sub);
        _solvent();
    }

    function test_reclaim_requeuesLastReturnedFirst() public {
        uint256 a = _claim(job, worker); // tasks 0..1
        uint256 b = _claim(job, worker2); // tasks 2..3
        _afterDeadline(a);
        job.reclaim(a);
        job.reclaim(b);
        assertEq(uint256(job.getLease(_claim(job, worker)).firstTask), s.tasksPerLease, "last returned first");
        assertEq(uint256(job.getLease(_claim(job, worker)).firstTask), 0, "then the earlier one");
        assertEq(uint256(job.getLease(_claim(job, worker)).firstTask), 2 * s.tasksPerLease, "then fresh tasks");
        assertEq(job.burned(), 2 * s.expiryFee, "two fees");
        _solvent();
    }

    // ================================================================== submit

    function test_submit_opensRoundZero() public {
        uint256 id = _claimReady(job, worker);
        bytes32 root = keccak256("root");
        uint64 voteDeadline = uint64(block.timestamp) + s.voteWindow;
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.BatchSubmitted(id, worker, root, 0, voteDeadline);
        vm.prank(worker);
        job.submit(id, root, 0);
        TrainingJob.Lease memory l = job.getLease(id);
        assertEq(uint256(l.status), uint256(TrainingJob.Status.Voting), "voting");
        assertEq(l.root, root, "root");
        assertEq(uint256(l.policyVersion), 0, "version");
        assertEq(uint256(l.anchorBlock), block.number, "round 0 starts at the submission block");
        assertEq(uint256(l.deadline), voteDeadline, "vote deadline");
        assertEq(uint256(l.round), 0, "round 0");
        assertEq(uint256(_round(id, 0).startBlock), block.number, "getRound startBlock");
        assertEq(uint256(job.outcomeOf(id)), uint256(TrainingJob.Outcome.Pending), "pending");
        _solvent();
    }

    function test_submit_revertsSeedNotDrawn() public {
        uint256 id = _claim(job, worker);
        _roll(1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.SeedNotDrawn.selector, id));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        _solvent();
    }

    function test_submit_leaseExpiredBoundary() public {
        uint256 id = _claimReady(job, worker);
        uint64 deadline = _deadline(job, id);
        uint256 snap = vmx.snapshotState();
        vm.warp(deadline);
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Voting), "accepted at the deadline");
        vmx.revertToState(snap);
        vm.warp(deadline + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.LeaseExpired.selector, id, deadline));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        _solvent();
    }

    /// @notice The staleness boundary, for versions older than the claim-time version (where only the
    ///         maxStaleness rule admits them): claimed at 3, current 4, versions 2 (4 - 2 == maxStaleness)
    ///         and up pass, 1 and 0 are too stale.
    function test_submit_stalePolicyBoundary() public {
        _publishTo(3);
        uint256 a = _claimReady(job, worker);
        uint256 b = _claimReady(job, worker2);
        assertEq(uint256(job.getLease(a).policyVersion), 3, "the claim records the current version");
        _publishTo(4);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.StalePolicy.selector, uint64(1), uint64(4), s.maxStaleness));
        vm.prank(worker);
        job.submit(a, bytes32(uint256(1)), 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.StalePolicy.selector, uint64(0), uint64(4), s.maxStaleness));
        vm.prank(worker);
        job.submit(a, bytes32(uint256(1)), 0);
        vm.prank(worker);
        job.submit(a, bytes32(uint256(1)), 2); // 4 - 2 == maxStaleness, older than the claim's 3
        vm.prank(worker2);
        job.submit(b, bytes32(uint256(1)), 4);
        assertEq(uint256(job.getLease(a).policyVersion), 2, "oldest admissible");
        assertEq(uint256(job.getLease(b).policyVersion), 4, "current");
        _solvent();
    }

    /// @notice A trainer publishing many versions at once cannot make a lease in flight fail: a lease
    ///         claimed at version v submits at v (or later) after v + maxStaleness + 3 is current, while a
    ///         version older than v that is too stale is still refused.
    function test_submit_claimTimeVersionSurvivesFastPublishing() public {
        _publishTo(2);
        uint64 v = job.currentVersion();
        uint256 a = _claimReady(job, worker);
        uint256 b = _claimReady(job, worker2);
        uint256 c = _claimReady(job, worker);
        assertEq(uint256(job.getLease(a).policyVersion), v, "claim-time version recorded");
        uint64 current = v + uint64(s.maxStaleness) + 3;
        _publishTo(current);
        assertGt(current - v, s.maxStaleness, "v is too stale by maxStaleness alone");
        // Older than the claim-time version and too stale: refused.
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.StalePolicy.selector, v - 1, current, s.maxStaleness));
        vm.prank(worker);
        job.submit(a, bytes32(uint256(1)), v - 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.StalePolicy.selector, uint64(0), current, s.maxStaleness));
        vm.prank(worker);
        job.submit(a, bytes32(uint256(1)), 0);
        // The claim-time version itself, and any later one, still pass.
        vm.prank(worker);
        job.submit(a, bytes32(uint256(1)), v);
        vm.prank(worker2);
        job.submit(b, bytes32(uint256(1)), v + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnpublishedPolicy.selector, current + 1, current));
        vm.prank(worker);
        job.submit(c, bytes32(uint256(1)), current + 1);
        vm.prank(worker);
        job.submit(c, bytes32(uint256(1)), current);
        assertEq(uint256(job.getLease(a).policyVersion), v, "submitted at the claim-time version");
        assertEq(uint256(job.getLease(b).policyVersion), v + 1, "a later stale version");
        assertEq(uint256(job.getLease(c).policyVersion), current, "current");
        assertEq(uint256(_status(job, a)), uint256(TrainingJob.Status.Voting), "lease in flight not failed");
        _solvent();
    }

    function test_submit_revertsUnpublishedPolicy() public {
        uint256 id = _claimReady(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnpublishedPolicy.selector, uint64(1), uint64(0)));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 1);
        vm.prank(trainer);
        job.publishPolicy(1, bytes32(uint256(1)));
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnpublishedPolicy.selector, type(uint64).max, uint64(1)));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), type(uint64).max);
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 1);
        assertEq(uint256(job.getLease(id).policyVersion), 1, "published version accepted");
        _solvent();
    }

    function test_submit_revertsNotHolderEmptyRootWrongStatus() public {
        uint256 id = _claimReady(job, worker);
        vm.expectRevert(TrainingJob.NotLeaseHolder.selector);
        vm.prank(worker2);
        job.submit(id, bytes32(uint256(1)), 0);
        vm.expectRevert(TrainingJob.EmptyRoot.selector);
        vm.prank(worker);
        job.submit(id, bytes32(0), 0);
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Voting));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(2)), 0);
        assertEq(job.getLease(id).root, bytes32(uint256(1)), "first root kept");
        _solvent();
    }

    function testFuzz_submit_timing(uint256 dt) public {
        dt = bound(dt, 0, 2 * uint256(s.leaseDuration));
        uint256 id = _claimReady(job, worker);
        uint64 deadline = _deadline(job, id);
        _warp(dt);
        if (block.timestamp <= deadline) {
            vm.prank(worker);
            job.submit(id, bytes32(uint256(1)), 0);
            assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Voting), "in time");
        } else {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.LeaseExpired.selector, id, deadline));
            vm.prank(worker);
            job.submit(id, bytes32(uint256(1)), 0);
            job.reclaim(id);
            assertEq(_active(worker), STAKE - s.expiryFee, "late: only the fee lost");
        }
        _solvent();
    }

    /// @notice `atClaim` versions published before the claim, `later` after it: a version is refused as
    ///         stale exactly when it is more than maxStaleness behind the current one and older than the
    ///         claim-time version.
    function testFuzz_submit_staleness(uint8 atClaim, uint8 later, uint64 version) public {
        atClaim = uint8(bound(atClaim, 0, 6));
        later = uint8(bound(later, 0, 6));
        version = uint64(bound(version, 0, 14));
        _publishTo(atClaim);
        uint256 id = _claimReady(job, worker);
        _publishTo(uint64(atClaim) + later);
        uint256 published = uint256(atClaim) + later;
        vm.prank(worker);
        if (version > published) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnpublishedPolicy.selector, version, uint64(published)));
            job.submit(id, bytes32(uint256(1)), version);
        } else if (published - version > s.maxStaleness && version < atClaim) {
            vm.expectRevert(
                abi.encodeWithSelector(TrainingJob.StalePolicy.selector, version, uint64(published), s.maxStaleness)
            );
            job.submit(id, bytes32(uint256(1)), version);
        } else {
            job.submit(id, bytes32(uint256(1)), version);
            assertEq(uint256(job.getLease(id).policyVersion), version, "accepted");
        }
        _solvent();
    }

    // ================================================================== committees

    function test_memberWeight_equalStakesEveryoneSits() public {
        uint256 id = _claimReady(job, worker);
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        // In the submission block the committee's randomness does not exist yet.
        assertEq(job.memberWeight(id, 0, v1), 0, "not drawable in the start block");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotInCommittee.selector, id, 0, v1));
        vm.prank(v1);
        job.vote(id, true);
        _roll(1);
        for (uint256 i = 0; i < vals.length; ++i) {
            assertEq(job.memberWeight(id, 0, vals[i]), STAKE, "k * w >= W: sits with its own weight");
        }
        assertEq(job.memberWeight(id, 0, worker), 0, "worker");
        assertEq(job.memberWeight(id, 0, worker2), 0, "no validator role");
        assertEq(job.memberWeight(id, 0, outsider), 0, "unregistered");
        assertEq(job.memberWeight(id, 1, v1), 0, "no round 1 yet");
        assertEq(_members(job, id, vals).length, 3, "all three");
        _solvent();
    }

    function test_committee_manyValidatorsDrawAboutCommitteeSize() public {
        uint256 n = 30;
        address[] memory cands = new address[](n + 3);
        for (uint256 i = 0; i < n; ++i) {
            cands[i] = makeAddr(string.concat("val", _two(i)));
            vm.deal(cands[i], 10 ether);
            _join(cands[i], VALIDATOR, MIN_VALIDATOR);
        }
        cands[n] = v1;
        cands[n + 1] = v2;
        cands[n + 2] = v3;
        vm.prank(worker);
        registry.addStake{value: 30 ether}();
        _roll(1);
        uint256 total = 3 * STAKE + n * MIN_VALIDATOR; // 75: nobody has k * w >= W, all are sampled
        uint256 leases = 40;
        uint256 seated;
        uint256 emptyCommittees;
        for (uint256 j = 0; j < leases; ++j) {
            uint256 id = _open();
            address[] memory m = _members(job, id, cands);
            seated += m.length;
            if (m.length == 0) ++emptyCommittees;
            for (uint256 i = 0; i < m.length; ++i) {
                assertEq(job.memberWeight(id, 0, m[i]), total / s.committeeSize, "sampled members vote with W / k");
            }
        }
        // Expected committeeSize (3) per lease: 120 seats over 40 leases; a loose band around it.
        assertGe(seated, leases * s.committeeSize / 2, "not far below committeeSize on average");
        assertLe(seated, leases * s.committeeSize * 3 / 2, "not far above committeeSize on average");
        assertLt(emptyCommittees, leases / 4, "empty committees are rare");
        emit log_named_uint("seats over 40 leases", seated);
        _solvent();
    }

    function _two(uint256 i) internal pure returns (string memory) {
        bytes memory b = new bytes(2);
        b[0] = bytes1(uint8(48 + (i / 10) % 10));
        b[1] = bytes1(uint8(48 + i % 10));
        return string(b);
    }

    /// @notice A worker can never vote on its own lease: it cannot also hold the validator role, so it has
    ///         no weight in any round (the final round, which seats every validator, included). Its votes
    ///         can only come from a separate validator address with its own stake, which sits like any other.
    function test_committee_workerNeverSitsOnItsOwnCommittee() public {
        address w3 = makeAddr("w3");
        address w3v = makeAddr("w3-validator");
        vm.deal(w3, 100 ether);
        vm.deal(w3v, 100 ether);
        uint256 key = _peerKey(w3);
        bytes memory pid = _peerIdOf(key);
        bytes memory sig = _peerSig(registry, key, w3);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, BOTH));
        vm.prank(w3);
        registry.join{value: 10 ether}(pid, sig, BOTH);
        _join(w3, WORKER, 10 ether);
        _join(w3v, VALIDATOR, 10 ether);
        _roll(1);
        uint256 id = _submitted(job, w3, 0);
        assertEq(job.memberWeight(id, 0, w3), 0, "round 0");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotInCommittee.selector, id, 0, w3));
        vm.prank(w3);
        job.vote(id, true);
        // Run to the final round, where every validator sits with its own weight: still not the worker.
        _afterDeadline(id);
        _appeal(job, v1, id);
        _afterDeadline(id);
        _appeal(job, v1, id);
        assertEq(uint256(job.getLease(id).round), 2, "final round");
        assertEq(job.memberWeight(id, 2, w3), 0, "worker excluded from the final round");
        assertEq(job.memberWeight(id, 2, v1), STAKE, "everyone else with own weight");
        assertEq(job.memberWeight(id, 2, w3v), 10 ether, "a separate validator address sits with its own stake");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotInCommittee.selector, id, 2, w3));
        vm.prank(w3);
        job.vote(id, true);
        // Nor does the worker sit on another worker's lease: it has no validator weight at all.
        uint256 other = _open();
        assertEq(job.memberWeight(other, 0, w3), 0, "a worker sits on no committee");
        assertEq(job.memberWeight(other, 0, w3v), 10 ether, "k * w = 30 >= W = 25: sits with its own weight");
        _solvent();
    }

    function test_committee_snapshotIsTheBlockBeforeTheStart() public {
        address v4 = makeAddr("v4");
        vm.deal(v4, 100 ether);
        uint256 id = _claimReady(job, worker);
        // In the submission block: v4 joins, v1 unbonds everything.
        _join(v4, VALIDATOR, 50 ether);
        vm.prank(v1);
        registry.requestUnbond(STAKE);
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        _roll(1);
        assertEq(job.memberWeight(id, 0, v4), 0, "joined at the start block: not in the snapshot");
        assertEq(job.memberWeight(id, 0, v1), STAKE, "unbonded at the start block: still in the snapshot");
        _vote(job, v1, id, true);
        assertEq(_round(id, 0).totalWeight, 3 * STAKE, "total at the block before");
        _vote(job, v2, id, true);
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Accept), "decided on the snapshot");
        _solvent();
    }

    function test_drawCommittee() public {
        uint256 id = _claimReady(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Leased));
        job.drawCommittee(id);
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        uint256 start = block.number;
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.RandomnessNotReady.selector, start));
        job.drawCommittee(id);
        uint256 snap = vmx.snapshotState();
        _roll(1);
        vm.expectEmit(true, false, false, false, address(job));
        emit TrainingJob.CommitteeDrawn(id, 0, bytes20(0), 0);
        job.drawCommittee(id);
        TrainingJob.Round memory rd = _round(id, 0);
        assertEq(rd.totalWeight, 3 * STAKE, "total fixed");
        assertTrue(rd.seed != bytes20(0), "seed fixed");
        // Once fixed it survives the 256-block horizon.
        vm.roll(start + 400);
        job.drawCommittee(id);
        assertEq(job.memberWeight(id, 0, v1), STAKE, "still a member");
        _vote(job, v1, id, true);
        vmx.revertToState(snap);
        // Never fixed: lost after 256 blocks, nobody can vote.
        vm.roll(start + 257);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.RandomnessExpired.selector, start));
        job.drawCommittee(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotInCommittee.selector, id, 0, v1));
        vm.prank(v1);
        job.vote(id, true);
        _solvent();
    }

    /// @notice The sample seed members verify from: unknown at submit (zero in the submission block), the
    ///         committee seed once the next block exists (the same before and after it is stored), kept once
    ///         stored, and zero for a lease never submitted or a round not yet opened.
    function test_roundSeed_fixedAfterSubmission() public {
        uint256 id = _claimReady(job, worker);
        assertEq(job.roundSeed(id, 0), bytes20(0), "not submitted");
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        uint256 start = block.number;
        assertEq(job.roundSeed(id, 0), bytes20(0), "unknown in the submission block");
        _roll(1);
        bytes20 viewed = job.roundSeed(id, 0);
        assertTrue(viewed != bytes20(0), "known from the next block");
        assertEq(job.roundSeed(id, 1), bytes20(0), "no appeal round yet");
        job.drawCommittee(id);
        assertEq(_round(id, 0).seed, viewed, "the stored seed is the one the view gave");
        vm.roll(start + 400);
        assertEq(job.roundSeed(id, 0), viewed, "kept past the 256-block horizon once stored");
        assertEq(job.roundSeed(id + 1, 0), bytes20(0), "unknown lease");
    }

    // ================================================================== votes

    function test_vote_revertsNotInCommitteeAlreadyVotedDeadlineAndDecided() public {
        uint256 id = _open();
        address[3] memory non = [outsider, worker2, worker];
        for (uint256 i = 0; i < non.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotInCommittee.selector, id, 0, non[i]));
            vm.prank(non[i]);
            job.vote(id, true);
        }
        _vote(job, v1, id, true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.AlreadyVoted.selector, id, v1));
        vm.prank(v1);
        job.vote(id, false);
        assertEq(job.ballots(id, v1), 1, "first ballot kept");
        assertEq(_round(id, 0).acceptWeight, STAKE, "counted once");
        assertEq(_round(id, 0).rejectWeight, 0, "no reject");

        uint64 deadline = _deadline(job, id);
        vm.warp(deadline);
        _vote(job, v2, id, false); // the deadline itself is still open
        vm.warp(deadline + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlinePassed.selector, id, deadline));
        vm.prank(v3);
        job.vote(id, false);

        uint256 id2 = _open();
        _acceptEarly(id2);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id2, TrainingJob.Status.Decided));
        vm.prank(v3);
        job.vote(id2, false);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnknownLease.selector, 77));
        vm.prank(v3);
        job.vote(77, false);
        _solvent();
    }

    function test_voteBatch_skipsWithVoteSkipped() public {
        uint256 a = _open();
        uint256 b = _open();
        uint256 d = _open();
        _acceptEarly(d); // closed
        _vote(job, v1, a, true); // already voted
        uint256 c = _claimReady(job, worker);
        vm.prank(worker);
        job.submit(c, bytes32(uint256(1)), 0); // committee not drawable in this block

        uint256[] memory ids = new uint256[](4);
        bool[] memory acc = new bool[](4);
        (ids[0], ids[1], ids[2], ids[3]) = (a, b, c, d);
        (acc[0], acc[1], acc[2], acc[3]) = (false, true, true, false);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.VoteSkipped(a, v1, TrainingJob.Refusal.AlreadyVoted);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Voted(b, 0, v1, true, STAKE);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.VoteSkipped(c, v1, TrainingJob.Refusal.NotMember);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.VoteSkipped(d, v1, TrainingJob.Refusal.NotOpen);
        vm.prank(v1);
        job.voteBatch(ids, acc);
        assertEq(job.ballots(a, v1), 1, "a unchanged (accept)");
        assertEq(job.ballots(b, v1), 1, "b voted");
        assertEq(job.ballots(c, v1), 0, "c skipped");
        assertEq(_round(d, 0).rejectWeight, 0, "d untouched");

        bool[] memory short = new bool[](3);
        vm.expectRevert(TrainingJob.LengthMismatch.selector);
        vm.prank(v2);
        job.voteBatch(ids, short);
        _solvent();
    }

    function test_vote_earlyDecisionWhenASideExceedsHalf() public {
        uint256 id = _open();
        _vote(job, v1, id, false);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Voting), "5 of 15 open");
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.RoundDecided(id, 0, TrainingJob.Outcome.Reject, uint64(block.timestamp) + s.appealWindow);
        _vote(job, v2, id, false);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Decided), "10 of 15 decides");
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Reject), "rejected");
        assertEq(uint256(job.outcomeOf(id)), uint256(TrainingJob.Outcome.Reject), "outcomeOf");
        assertEq(_round(id, 0).rejectWeight, 2 * STAKE, "weights");
        _solvent();
    }

    function test_vote_exactlyHalfDoesNotDecide() public {
        address v4 = makeAddr("v4");
        vm.deal(v4, 100 ether);
        _join(v4, VALIDATOR, STAKE);
        _roll(1);
        uint256 id = _open(); // W = 20, k * w = 15 < 20: sampled, weight W / k each
        address[] memory four = new address[](4);
        (four[0], four[1], four[2], four[3]) = (v1, v2, v3, v4);
        address[] memory m = _members(job, id, four);
        // With equal stakes and committeeSize 4 everyone would sit; here check the rule on the real draw:
        uint256 side;
        for (uint256 i = 0; i < m.length; ++i) {
            uint256 w = job.memberWeight(id, 0, m[i]);
            bool wasOpen = _status(job, id) == TrainingJob.Status.Voting;
            if (!wasOpen) break;
            _vote(job, m[i], id, true);
            side += w;
            bool open = _status(job, id) == TrainingJob.Status.Voting;
            assertEq(open, 2 * side <= 20 ether, "decided exactly when the side exceeds half of W");
        }
        // And with everyone sitting (committeeSize 4 on a new job): two of four is exactly half.
        JobSpec memory s4 = _spec();
        s4.committeeSize = 4;
        TrainingJob j4 = _createJob(s4, BUDGET);
        uint256 id4 = _submitted(j4, worker2, 0);
        _vote(j4, v1, id4, true);
        _vote(j4, v2, id4, true);
        assertEq(uint256(_status(j4, id4)), uint256(TrainingJob.Status.Voting), "10 of 20 is not more than half");
        _vote(j4, v3, id4, false);
        _vote(j4, v4, id4, false);
        assertEq(uint256(_status(j4, id4)), uint256(TrainingJob.Status.Voting), "tie stays open");
        vm.warp(uint256(_deadline(j4, id4)) + 1);
        assertEq(uint256(j4.outcomeOf(id4)), uint256(TrainingJob.Outcome.Void), "tie at the deadline is void");
        _solvent();
    }

    function test_lateClose_largerSideWins() public {
        uint256 id = _open();
        _vote(job, v1, id, true);
        uint64 voteDeadline = _deadline(job, id);
        vm.warp(voteDeadline + 1);
        assertEq(uint256(job.outcomeOf(id)), uint256(TrainingJob.Outcome.Accept), "larger side");
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Voting), "not yet recorded");
        // The appeal window counts from the vote deadline, whenever someone notices.
        vm.expectRevert(
            abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, voteDeadline + s.appealWindow)
        );
        job.finalize(id);
        vm.warp(voteDeadline + s.appealWindow + 1);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "paid");
        assertEq(job.owed(worker), cost, "worker credited");
        _solvent();
    }

    function test_lateClose_tieAndNoVotesAreVoid() public {
        uint256 tie = _open();
        uint256 none = _open();
        _vote(job, v1, tie, true);
        _vote(job, v2, tie, false);
        uint256 lockedBefore = _locked(worker);
        vm.warp(uint256(_deadline(job, none)) + s.appealWindow + 1);
        assertEq(uint256(job.outcomeOf(tie)), uint256(TrainingJob.Outcome.Void), "tie");
        assertEq(uint256(job.outcomeOf(none)), uint256(TrainingJob.Outcome.Void), "no votes");
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Settled(tie, worker, TrainingJob.Outcome.Void, 0);
        job.finalize(tie);
        job.finalize(none);
        assertEq(uint256(_status(job, tie)), uint256(TrainingJob.Status.Lapsed), "lapsed");
        assertEq(uint256(_status(job, none)), uint256(TrainingJob.Status.Lapsed), "lapsed");
        assertEq(_locked(worker), lockedBefore - 2 * s.slashAmount, "both collaterals released");
        assertEq(_active(worker), STAKE, "nothing taken");
        assertEq(job.owed(worker), 0, "nothing paid");
        assertEq(job.escrow(), BUDGET, "escrow intact");
        assertEq(job.reserved(), 0, "reservations released");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, tie, v1));
        job.slashLoser(tie, v1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, tie, v2));
        job.slashLoser(tie, v2);
        _solvent();
    }

    // ================================================================== appeals

    function test_appeal_bondDoublesPerRound() public view {
        assertEq(job.appealBondFor(1), s.appealBond, "round 1");
        assertEq(job.appealBondFor(2), 2 * s.appealBond, "round 2");
        assertEq(job.appealBondFor(3), 4 * s.appealBond, "round 3");
        assertEq(job.committeeSizeOf(0), s.committeeSize, "k0");
        assertEq(job.committeeSizeOf(1), 2 * s.committeeSize, "k1 doubles");
        assertEq(job.committeeSizeOf(2), type(uint256).max, "final round: everyone");
    }

    function test_appeal_opensLargerRoundWithFreshCommittee() public {
        uint256 id = _open();
        _acceptEarly(id);
        uint256 bond = s.appealBond;
        uint64 voteDeadline = uint64(block.timestamp) + s.voteWindow;
        vm.expectEmit(true, true, true, true, address(job));
        emit TrainingJob.Appealed(id, 1, v3, bond, voteDeadline);
        vm.prank(v3);
        job.appeal{value: bond}(id);
        TrainingJob.Lease memory l = job.getLease(id);
        assertEq(uint256(l.round), 1, "round 1");
        assertEq(uint256(l.status), uint256(TrainingJob.Status.Voting), "voting");
        assertEq(uint256(l.outcome), uint256(TrainingJob.Outcome.Pending), "pending");
        assertEq(uint256(l.deadline), voteDeadline, "vote deadline");
        (TrainingJob.Round memory rd, address appellant) = job.getRound(id, 1);
        assertEq(uint256(rd.startBlock), block.number, "starts at the appeal block");
        assertEq(appellant, v3, "appellant");
        assertEq(job.appellants(id, 1), v3, "appellants");
        assertEq(job.bondsHeld(), bond, "bond held");
        assertEq(job.memberWeight(id, 1, v1), 0, "not drawable in the appeal block");
        _roll(1);
        assertEq(job.memberWeight(id, 1, v1), STAKE, "drawable after");
        assertEq(job.memberWeight(id, 0, v1), STAKE, "round 0 still readable");
        _solvent();
    }

    function test_appeal_revertsWrongBond() public {
        uint256 id = _open();
        _acceptEarly(id);
        uint256[3] memory wrong = [uint256(0), s.appealBond - 1, 2 * s.appealBond];
        for (uint256 i = 0; i < wrong.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongBond.selector, s.appealBond, wrong[i]));
            vm.prank(v3);
            job.appeal{value: wrong[i]}(id);
        }
        _appeal(job, v3, id);
        _acceptEarly(id);
        uint256 b2 = 2 * s.appealBond;
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongBond.selector, b2, s.appealBond));
        vm.prank(v3);
        job.appeal{value: s.appealBond}(id);
        vm.prank(v3);
        job.appeal{value: b2}(id);
        assertEq(job.bondsHeld(), 3 * s.appealBond, "0.2 + 0.4 held");
        _solvent();
    }

    function test_appeal_revertsFinalRoundWhileVotingAndDeadlinePassed() public {
        uint256 id = _open();
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Voting));
        vm.prank(v3);
        job.appeal{value: s.appealBond}(id);
        _acceptEarly(id);
        uint64 deadline = _deadline(job, id);
        vm.warp(deadline + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlinePassed.selector, id, deadline));
        vm.prank(v3);
        job.appeal{value: s.appealBond}(id);

        uint256 id2 = _open();
        _acceptEarly(id2);
        vm.warp(_deadline(job, id2)); // the appeal deadline itself is still open
        _appeal(job, v3, id2);
        _acceptEarly(id2);
        _appeal(job, v3, id2);
        _acceptEarly(id2); // final round decided
        uint256 b3 = 4 * s.appealBond;
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.FinalRound.selector, id2));
        vm.prank(v3);
        job.appeal{value: b3}(id2);
        _solvent();
    }

    function test_appeal_onlyActiveStakedParties() public {
        uint256 id = _open();
        _acceptEarly(id);
        _join(trainer, TRAINER_ROLE, 0);
        uint256 bond = s.appealBond;
        vm.deal(trainer, 10 ether);
        address[3] memory no = [outsider, trainer, requester];
        for (uint256 i = 0; i < no.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, no[i], BOTH));
            vm.prank(no[i]);
            job.appeal{value: bond}(id);
        }
        // A validator below its minimum is not active either.
        vm.prank(v3);
        registry.requestUnbond(STAKE - MIN_VALIDATOR + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, v3, BOTH));
        vm.prank(v3);
        job.appeal{value: bond}(id);
        // An active worker (even the lease's own) may appeal.
        vm.prank(worker);
        job.appeal{value: bond}(id);
        assertEq(job.appellants(id, 1), worker, "worker appealed");
        _solvent();
    }

    function test_appeal_afterVoteWindowWithoutDecision() public {
        uint256 id = _open();
        uint64 voteDeadline = _deadline(job, id);
        vm.warp(voteDeadline + s.appealWindow + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlinePassed.selector, id, voteDeadline + s.appealWindow));
        vm.prank(v1);
        job.appeal{value: s.appealBond}(id);
        vm.warp(voteDeadline + s.appealWindow);
        _appeal(job, v1, id);
        assertEq(uint256(job.getLease(id).round), 1, "a void round is appealable");
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Voting), "voting again");
        _solvent();
    }

    // ================================================================== finalize

    function test_finalize_appealWindowBoundary() public {
        uint256 id = _open();
        _acceptEarly(id);
        uint64 deadline = _deadline(job, id);
        vm.warp(deadline);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, deadline));
        job.finalize(id);
        vm.warp(deadline + 1);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "after the window");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Paid));
        job.finalize(id);
        _solvent();
    }

    function test_finalize_revertsWhileVoting() public {
        uint256 id = _open();
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Voting));
        job.finalize(id);
        uint256 leased = _claim(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, leased, TrainingJob.Status.Leased));
        job.finalize(leased);
        _solvent();
    }

    function test_finalize_finalRoundSettlesAtOnce() public {
        uint256 id = _open();
        _acceptEarly(id);
        _appeal(job, worker2, id);
        _acceptEarly(id);
        _appeal(job, worker2, id);
        _vote(job, v1, id, true);
        _vote(job, v3, id, true);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Decided), "final round decided");
        assertEq(uint256(_deadline(job, id)), block.timestamp, "no appeal window after the final round");
        job.finalize(id); // same second
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "settled at once");
        _solvent();
    }

    function test_finalize_finalRoundAtItsVoteDeadline() public {
        uint256 id = _open();
        _acceptEarly(id);
        _appeal(job, worker2, id);
        _acceptEarly(id);
        _appeal(job, worker2, id);
        _vote(job, v1, id, false); // 5 of 15: not decisive
        uint64 voteDeadline = _deadline(job, id);
        vm.warp(voteDeadline);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Voting));
        job.finalize(id);
        vm.warp(voteDeadline + 1);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "the final round's larger side");
        _solvent();
    }

    // ================================================================== settlement

    function test_settle_rejectTakesCollateralToWinners() public {
        uint256 id = _open();
        _vote(job, v1, id, true);
        _rejectEarly(id);
        _finalizeNow(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "slashed");
        assertEq(_active(worker), STAKE - s.slashAmount, "collateral taken");
        assertEq(_locked(worker), 0, "nothing left locked");
        assertEq(job.owed(worker), 0, "not paid");
        assertEq(job.burned(), s.slashAmount / 10, "10% burned");
        assertEq(_voterPool(id), s.slashAmount * 9 / 10, "90% to winning voters");
        assertEq(job.rewardOf(id, v2), s.slashAmount * 9 / 20, "half each");
        assertEq(job.rewardOf(id, v1), 0, "loser gets nothing");
        assertEq(job.escrow(), BUDGET, "escrow untouched");
        assertEq(job.reserved(), 0, "reservation released");
        _solvent();

        job.slashLoser(id, v1);
        assertEq(_active(v1), STAKE - s.voterSlash, "loser slashed");
        assertEq(job.rewardOf(id, v2), (s.slashAmount + s.voterSlash) * 9 / 20, "pool grew");
        assertEq(job.burned(), (s.slashAmount + s.voterSlash) / 10, "burn of both");
        _cashOut(job, id, v2);
        _cashOut(job, id, v3);
        assertEq(job.poolHeld(), 0, "pool paid out exactly");
        uint256 before = requester.balance;
        vm.prank(requester);
        job.close();
        assertEq(requester.balance, before + BUDGET, "requester gets its budget back, no slashed wei");
        assertEq(address(job).balance, job.burned(), "only the burn stays");
        _solvent();
    }

    function test_settle_bondRefundedToWinningAppellant() public {
        uint256 id = _open();
        _vote(job, v1, id, false);
        _afterDeadline(id); // round 0 closes: Reject by 5 to 0
        vm.expectEmit(true, true, true, true, address(job));
        emit TrainingJob.Appealed(id, 1, worker, s.appealBond, uint64(block.timestamp) + s.voteWindow);
        _appeal(job, worker, id);
        _vote(job, v2, id, true);
        _vote(job, v3, id, true);
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Accept), "overturned");
        _afterDeadline(id);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.BondRefunded(id, worker, s.appealBond);
        job.finalize(id);
        assertEq(job.owed(worker), cost + s.appealBond, "paid and refunded");
        assertEq(job.bondsHeld(), 0, "no bonds held");
        job.slashLoser(id, v1);
        uint256 rest = s.voterSlash - s.voterSlash / 10;
        assertEq(_appellantPool(id), rest / 4, "winning appellants' 25%");
        assertEq(_voterPool(id), rest - rest / 4, "winning voters the rest");
        assertEq(job.rewardOf(id, worker), rest / 4, "the one winning appellant");
        assertEq(job.rewardOf(id, v2), (rest - rest / 4) / 2, "v2");
        _solvent();
    }

    function test_settle_bondForfeitedByLosingAppellant() public {
        uint256 id = _open();
        _acceptEarly(id);
        _appeal(job, worker2, id);
        _acceptEarly(id);
        _finalizeNow(id);
        assertEq(job.owed(worker2), 0, "no refund");
        assertEq(job.bondsHeld(), 0, "bond released into the pool");
        assertEq(job.burned(), s.appealBond / 10, "10% burned");
        // Winning weight: 10 (round 0) + 10 (round 1); v1 and v2 hold 10 each.
        assertEq(job.rewardOf(id, v1), (s.appealBond - s.appealBond / 10) / 2, "v1 half");
        assertEq(job.rewardOf(id, v3), 0, "v3 did not vote");
        assertEq(job.rewardOf(id, worker2), 0, "losing appellant");
        assertEq(_appellantPool(id), 0, "no winning appellant");
        _solvent();
    }

    // ================================================================== slashLoser

    function test_slashLoser_onlyAfterSettlementOnlyLosersOnce() public {
        uint256 id = _open();
        _vote(job, v1, id, true);
        _rejectEarly(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSettled.selector, id));
        job.slashLoser(id, v1);
        _finalizeNow(id);
        address[3] memory notLosers = [v2, outsider, worker];
        for (uint256 i = 0; i < notLosers.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, notLosers[i]));
            job.slashLoser(id, notLosers[i]);
        }
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.LoserSlashed(id, v1, s.voterSlash);
        vm.prank(outsider); // anyone may call it
        job.slashLoser(id, v1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, v1));
        job.slashLoser(id, v1);
        assertEq(_active(v1), STAKE - s.voterSlash, "slashed once");
        _solvent();
    }

    function test_slashLoser_reachesUnbondingStake() public {
        uint256 id = _open();
        _vote(job, v1, id, true);
        vm.prank(v1);
        registry.requestUnbond(STAKE);
        _rejectEarly(id);
        _finalizeNow(id);
        job.slashLoser(id, v1);
        assertEq(_unbonding(v1), STAKE - s.voterSlash, "taken from unbonding");
        assertEq(_active(v1), 0, "no active");
        _solvent();
    }

    function test_slashLoser_votedAgainstInAnyRound() public {
        uint256 id = _open();
        _vote(job, v1, id, false);
        _vote(job, v2, id, true);
        _vote(job, v3, id, true); // round 0: Accept; v1 lost it
        _appeal(job, worker2, id);
        _vote(job, v1, id, true);
        _vote(job, v2, id, true); // round 1: Accept with v1
        _finalizeNow(id);
        job.slashLoser(id, v1);
        assertEq(_active(v1), STAKE - s.voterSlash, "slashed for round 0");
        assertGt(job.rewardOf(id, v1), 0, "rewarded for round 1");
        _solvent();
    }

    /// @dev Switch the tests' `job` to a sampled one: each first-round member verifies 1 of the 8 rollouts.
    function _useSampledJob() internal {
        JobSpec memory sampled = _spec();
        sampled.samplesChecked = 1;
        job = _createJob(sampled, BUDGET);
        for (uint256 i = 0; i < vals.length; ++i) {
            _enlist(job, vals[i]);
        }
        _roll(1);
    }

    /// @notice The griefing a sampled first round would invite: a cheating worker whose accomplice validator
    ///         (v1) knows the fake, rejects and appeals, so every member whose sample missed it loses the vote.
    ///         Those good-faith accepts are not slashable, so the pair gains nothing from them: it loses the
    ///         worker's collateral, and the honest members keep all their stake.
    function test_slashLoser_sampledFirstRoundAcceptsOfARejectedBatchAreNotSlashable() public {
        _useSampledJob();
        uint256 pairBefore = _wealth(job, worker) + _wealth(job, v1);
        uint256 v2Before = _wealth(job, v2);
        uint256 id = _open();
        _vote(job, v1, id, false); // v1's sample held the fake (it knew where it was)
        _vote(job, v2, id, true);
        _vote(job, v3, id, true); // round 0: Accept, by samples that missed it
        _appeal(job, v1, id);
        _vote(job, v1, id, false);
        _vote(job, v2, id, false); // round 1 verifies everything: Reject
        _finalizeNow(id);
        assertEq(uint8(_status(job, id)), uint8(TrainingJob.Status.Slashed), "the cheat is slashed");
        address[2] memory inGoodFaith = [v2, v3];
        for (uint256 i = 0; i < inGoodFaith.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, inGoodFaith[i]));
            job.slashLoser(id, inGoodFaith[i]);
            assertEq(_active(inGoodFaith[i]), STAKE, "an honest sampled accept keeps its stake");
        }
        vm.prank(v1);
        job.claimReward(id);
        vm.prank(worker);
        try job.claimReward(id) {} catch {} // the worker won nothing
        uint256 pairAfter = _wealth(job, worker) + _wealth(job, v1);
        assertLt(pairAfter, pairBefore, "the pair's net gain is negative");
        assertGe(pairBefore - pairAfter, s.slashAmount / 10, "it loses at least the burned part of the collateral");
        assertGe(_wealth(job, v2), v2Before, "an honest member loses nothing");
        _solvent();
    }

    /// @notice A sampled rejection is proof of a fake: overturned by a round that verified everything, it is
    ///         slashed as before (a validator gains nothing by rejecting honest work it sampled).
    function test_slashLoser_sampledFirstRoundRejectsOfAnAcceptedBatchAreSlashable() public {
        _useSampledJob();
        uint256 id = _open();
        _vote(job, v1, id, false);
        _vote(job, v2, id, false); // round 0: Reject
        _appeal(job, worker, id);
        _vote(job, v3, id, true);
        _vote(job, v1, id, true); // round 1: Accept
        _finalizeNow(id);
        job.slashLoser(id, v1);
        job.slashLoser(id, v2);
        assertEq(_active(v1), STAKE - s.voterSlash, "v1 slashed for its round-0 reject");
        assertEq(_active(v2), STAKE - s.voterSlash, "v2 slashed for its round-0 reject");
        _solvent();
    }

    // ================================================================== penalizeAbsent

    function test_penalizeAbsent_membersWhoDidNotVoteInARoundThatRanToItsDeadline() public {
        // v4: enlisted, but with no weight in the round's snapshot (it unbonded everything first).
        address v4 = makeAddr("v4");
        vm.deal(v4, 10 ether);
        _join(v4, VALIDATOR, MIN_VALIDATOR);
        _enlist(job, v4);
        vm.prank(v4);
        registry.requestUnbond(MIN_VALIDATOR);
        uint256 id = _open();
        assertTrue(job.enlistedFor(v4, job.getLease(id).anchorBlock), "v4 enlisted for round 0");
        _vote(job, v1, id, true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.RoundOpen.selector, id, 0));
        job.penalizeAbsent(id, 0, v2);
        _afterDeadline(id);

        vm.expectEmit(true, false, true, true, address(job));
        emit TrainingJob.AbsentPenalized(id, 0, v2, s.absentPenalty);
        vm.prank(outsider);
        job.penalizeAbsent(id, 0, v2);
        assertEq(_active(v2), STAKE - s.absentPenalty, "penalized");
        assertEq(_pending(id), s.absentPenalty, "held until the outcome is final");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotAbsent.selector, id, 0, v2));
        job.penalizeAbsent(id, 0, v2);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotAbsent.selector, id, 0, v1));
        job.penalizeAbsent(id, 0, v1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotInCommittee.selector, id, 0, v4));
        job.penalizeAbsent(id, 0, v4);
        // Nobody who could not enlist (not a validator) answers for absence.
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, outsider));
        job.penalizeAbsent(id, 0, outsider);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, worker));
        job.penalizeAbsent(id, 0, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Decided));
        job.penalizeAbsent(id, 1, v2);

        _finalizeNow(id);
        assertEq(_pending(id), 0, "pending distributed at settlement");
        job.penalizeAbsent(id, 0, v3); // after settlement: distributed at once
        uint256 pool = 2 * s.absentPenalty;
        assertEq(job.burned(), pool / 10, "burn");
        assertEq(job.rewardOf(id, v1), pool - pool / 10, "the only winning voter gets the rest");
        _cashOut(job, id, v1);
        _solvent();
    }

    function test_penalizeAbsent_notForRoundsDecidedEarly() public {
        uint256 id = _open();
        _acceptEarly(id);
        vm.warp(block.timestamp + s.voteWindow + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotAbsent.selector, id, 0, v3));
        job.penalizeAbsent(id, 0, v3);
        _finalizeNow(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotAbsent.selector, id, 0, v3));
        job.penalizeAbsent(id, 0, v3);
        assertEq(_active(v3), STAKE, "untouched");
        _solvent();
    }

    function test_penalizeAbsent_earlierRoundWhileAppealRuns() public {
        uint256 id = _open();
        _vote(job, v1, id, false);
        _afterDeadline(id);
        _appeal(job, worker, id);
        job.penalizeAbsent(id, 0, v2);
        assertEq(_pending(id), s.absentPenalty, "pending while round 1 votes");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.RoundOpen.selector, id, 1));
        job.penalizeAbsent(id, 1, v2);
        _vote(job, v2, id, true);
        _vote(job, v3, id, true);
        _finalizeNow(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotAbsent.selector, id, 1, v1));
        job.penalizeAbsent(id, 1, v1); // round 1 was decided early
        _solvent();
    }

    // ================================================================== enlist / delist

    /// @notice Only an active validator enlists, once; enlistedAt records the block and it counts for rounds
    ///         starting after that block.
    function test_enlist_activeValidatorsOnlyOnce() public {
        TrainingJob j = _createJob(s, BUDGET);
        uint256 b = block.number;
        assertEq(uint256(j.enlistedAt(v1)), 0, "not enlisted in a fresh job");
        assertFalse(j.enlistedFor(v1, b + 1), "not enlisted: counts for no round");
        vm.expectEmit(true, false, false, true, address(j));
        emit TrainingJob.Enlisted(v1);
        _enlist(j, v1);
        assertEq(uint256(j.enlistedAt(v1)), b, "enlisted at this block");
        assertEq(uint256(j.delistedAt(v1)), 0, "not delisted");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.AlreadyEnlisted.selector, v1));
        vm.prank(v1);
        j.enlist();
        // Workers, trainers, outsiders and a validator below its minimum are no active validators.
        _join(trainer, TRAINER_ROLE, 0);
        vm.prank(v3);
        registry.requestUnbond(STAKE - MIN_VALIDATOR + 1);
        address[4] memory no = [worker, trainer, outsider, v3];
        for (uint256 i = 0; i < no.length; ++i) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, no[i], VALIDATOR));
            vm.prank(no[i]);
            j.enlist();
            assertEq(uint256(j.enlistedAt(no[i])), 0, "not enlisted");
        }
        // Enlisting in one job says nothing about another.
        TrainingJob other = _createJob(s, BUDGET);
        assertEq(uint256(other.enlistedAt(v1)), 0, "per job");
        _solvent();
    }

    /// @notice enlistedFor(v, start): enlisted in a block before `start` and not delisted before `start`.
    ///         Enlisting in the start block is too late; delisting in the start block is too late to leave it.
    ///         Delisting is final.
    function test_enlistedFor_blockBoundariesAndFinalDelist() public {
        TrainingJob j = _createJob(s, BUDGET);
        uint256 e = block.number;
        _enlist(j, v1);
        assertFalse(j.enlistedFor(v1, e - 1), "a round started before the enlistment");
        assertFalse(j.enlistedFor(v1, e), "a round starting in the enlistment block");
        assertTrue(j.enlistedFor(v1, e + 1), "a round starting in the next block");
        assertTrue(j.enlistedFor(v1, e + 1000), "and every later one while enlisted");
        _roll(5);
        uint256 d = block.number;
        vm.expectEmit(true, false, false, true, address(j));
        emit TrainingJob.Delisted(v1);
        vm.prank(v1);
        j.delist();
        assertEq(uint256(j.delistedAt(v1)), d, "delisted at this block");
        assertEq(uint256(j.enlistedAt(v1)), e, "enlistment block kept");
        assertFalse(j.enlistedFor(v1, e), "still not the enlistment block");
        assertTrue(j.enlistedFor(v1, e + 1), "rounds started while enlisted still count");
        assertTrue(j.enlistedFor(v1, d), "a round starting in the delisting block still counts");
        assertFalse(j.enlistedFor(v1, d + 1), "a round starting after the delisting block does not");
        assertFalse(j.enlistedFor(v1, d + 1000), "nor any later one");
        // Final: no second delist, no re-enlisting.
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, v1));
        vm.prank(v1);
        j.delist();
        _roll(1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.AlreadyEnlisted.selector, v1));
        vm.prank(v1);
        j.enlist();
        assertFalse(j.enlistedFor(v1, block.number + 1), "still out");
        // Delisting needs an enlistment.
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, v2));
        vm.prank(v2);
        j.delist();
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, outsider));
        vm.prank(outsider);
        j.delist();
        assertFalse(j.enlistedFor(v2, block.number + 1), "never enlisted");
    }

    /// @notice penalizeAbsent reaches only members enlisted when the round took its snapshot. Six equal
    ///         validators, committee 6 (everyone sits), nobody but v6 votes, so round 0 runs to its deadline:
    ///         v1 (enlisted long before) and v5 (delisted in the start block) are penalized; v2 (never
    ///         enlisted), v3 (delisted before the start) and v4 (enlisted in the start block) are not.
    ///         v6 votes without ever enlisting: voting needs no enlistment.
    function test_penalizeAbsent_onlyMembersEnlistedAtTheRoundsStart() public {
        address v4 = makeAddr("v4");
        address v5 = makeAddr("v5");
        address v6 = makeAddr("v6");
        address[3] memory more = [v4, v5, v6];
        for (uint256 i = 0; i < 3; ++i) {
            vm.deal(more[i], 10 ether);
            _join(more[i], VALIDATOR, STAKE);
        }
        JobSpec memory s6 = _spec();
        s6.committeeSize = 6; // W = 30: 6 * 5 >= 30, everyone sits
        TrainingJob j = _createJob(s6, BUDGET);
        _enlist(j, v1);
        _enlist(j, v3);
        _enlist(j, v5);
        _roll(1);
        vm.prank(v3);
        j.delist(); // before the round's start block
        uint256 id = _claim(j, worker);
        _roll(1);
        j.drawSeed(id);
        uint256 start = block.number;
        _enlist(j, v4); // in the start block: too late for this round
        vm.prank(v5);
        j.delist(); // in the start block: too late to leave this round
        vm.prank(worker);
        j.submit(id, bytes32(uint256(1)), 0);
        _roll(1);
        assertEq(uint256(j.getLease(id).anchorBlock), start, "round 0 starts at the submission block");
        address[6] memory all = [v1, v2, v3, v4, v5, v6];
        for (uint256 i = 0; i < 6; ++i) {
            assertEq(j.memberWeight(id, 0, all[i]), STAKE, "everyone sits");
        }
        _vote(j, v6, id, true); // 5 of 30: no majority
        vm.warp(uint256(_deadline(j, id)) + 1);

        address[3] memory notEnlisted = [v2, v3, v4];
        for (uint256 i = 0; i < 3; ++i) {
            assertFalse(j.enlistedFor(notEnlisted[i], start), "not enlisted for round 0");
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, notEnlisted[i]));
            j.penalizeAbsent(id, 0, notEnlisted[i]);
            assertEq(_active(notEnlisted[i]), STAKE, "untouched");
        }
        address[2] memory enlisted = [v1, v5];
        for (uint256 i = 0; i < 2; ++i) {
            assertTrue(j.enlistedFor(enlisted[i], start), "enlisted for round 0");
            vm.expectEmit(true, false, true, true, address(j));
            emit TrainingJob.AbsentPenalized(id, 0, enlisted[i], s6.absentPenalty);
            j.penalizeAbsent(id, 0, enlisted[i]);
            assertEq(_active(enlisted[i]), STAKE - s6.absentPenalty, "penalized");
        }
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotAbsent.selector, id, 0, v6));
        j.penalizeAbsent(id, 0, v6);
        (uint256 pending,,) = j.disputes(id);
        assertEq(pending, 2 * s6.absentPenalty, "two penalties held for the lease");
        // v4 answers for the next round, which starts after its enlistment.
        _appeal(j, v6, id);
        (TrainingJob.Round memory r1,) = j.getRound(id, 1);
        assertTrue(j.enlistedFor(v4, r1.startBlock), "v4 enlisted for round 1");
        assertFalse(j.enlistedFor(v5, r1.startBlock), "v5 left before round 1");
        _assertJobSolvent(j);
        _assertRegistrySolvent();
    }

    /// @notice A lease that expired unsubmitted (Returned) never had a committee: nobody can be penalized as
    ///         absent from its "round 0" and it reports no members (found by review: before, every validator
    ///         of the claim-block snapshot could be, with the penalty stuck in `poolHeld`).
    function test_penalizeAbsent_refusesAReturnedLease_whichHadNoRound() public {
        JobSpec memory short = _spec();
        short.leaseDuration = 10 minutes;
        TrainingJob j = _createJob(short, BUDGET);
        _enlist(j, v1); // v1 would answer for absence in j's rounds, had there been any
        _roll(1);
        uint256 id = _claim(j, worker);
        _roll(50);
        vm.warp(uint256(_deadline(j, id)) + 1);
        j.reclaim(id);
        assertEq(uint256(_status(j, id)), uint256(TrainingJob.Status.Returned), "returned, never submitted");
        try j.penalizeAbsent(id, 0, v1) {} catch {}
        assertEq(_active(v1), STAKE, "a validator was penalized as absent from a round that never existed");
        assertEq(j.poolHeld(), 0, "penalty stuck in poolHeld of a lease that can never settle");
        assertEq(j.memberWeight(id, 0, v1), 0, "a returned lease has no committee");
        _solvent();
    }

    // ================================================================== claimReward / withdrawPayment

    function test_claimReward_proRataAndCallableAgainAsThePoolGrows() public {
        uint256 id = _open();
        _acceptEarly(id); // round 0: v1, v2 accept
        _appeal(job, worker2, id);
        _vote(job, v2, id, false);
        _vote(job, v1, id, true);
        _vote(job, v3, id, true); // round 1: v1, v3 accept; v2 lost it
        _finalizeNow(id);
        // Winning weight 20: v1 10, v2 5 (round 0), v3 5. Pool so far: the forfeited bond.
        uint256 pool = s.appealBond - s.appealBond / 10;
        assertEq(job.rewardOf(id, v1), pool / 2, "v1 half");
        assertEq(job.rewardOf(id, v2), pool / 4, "v2 quarter");
        assertEq(job.rewardOf(id, v3), pool / 4, "v3 quarter");

        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.RewardClaimed(id, v1, pool / 2);
        vm.prank(v1);
        job.claimReward(id);
        assertEq(job.owed(v1), pool / 2, "credited");
        vm.expectRevert(TrainingJob.NothingOwed.selector);
        vm.prank(v1);
        job.claimReward(id);

        job.slashLoser(id, v2);
        uint256 pool2 = pool + s.voterSlash - s.voterSlash / 10;
        assertEq(job.rewardOf(id, v1), pool2 / 2, "entitlement grew");
        vm.prank(v1);
        job.claimReward(id);
        assertEq(job.owed(v1), pool2 / 2, "the increment credited");
        assertEq(job.rewardClaimed(id, v1), pool2 / 2, "claimed so far");
        _cashOut(job, id, v2);
        _cashOut(job, id, v3);
        assertEq(job.burned(), (s.appealBond + s.voterSlash) / 10, "BURN_BPS of everything");
        assertEq(job.poolHeld(), 0, "pools paid in full");
        uint256 before = v1.balance;
        vm.prank(v1);
        job.withdrawPayment();
        assertEq(v1.balance, before + pool2 / 2, "withdrawn");
        _solvent();
    }

    function test_claimReward_reverts() public {
        uint256 id = _open();
        _vote(job, v1, id, true);
        _rejectEarly(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSettled.selector, id));
        vm.prank(v2);
        job.claimReward(id);
        _finalizeNow(id);
        vm.expectRevert(TrainingJob.NothingOwed.selector);
        vm.prank(v1);
        job.claimReward(id); // a loser
        vm.expectRevert(TrainingJob.NothingOwed.selector);
        vm.prank(outsider);
        job.claimReward(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnknownLease.selector, 50));
        job.claimReward(50);
        _solvent();
    }

    function test_withdrawPayment_paysEverythingOnceAndRevertsWhenNothingOwed() public {
        vm.expectRevert(TrainingJob.NothingOwed.selector);
        vm.prank(worker);
        job.withdrawPayment();
        uint256 a = _open();
        uint256 b = _open();
        _acceptEarly(a);
        _acceptEarly(b);
        _finalizeNow(a);
        job.finalize(b);
        uint256 before = worker.balance;
        vm.prank(worker);
        job.withdrawPayment();
        assertEq(worker.balance, before + 2 * cost, "both leases");
        vm.expectRevert(TrainingJob.NothingOwed.selector);
        vm.prank(worker);
        job.withdrawPayment();
        _solvent();
    }

    // ================================================================== close / receive

    function test_close_refundsOnlyUnreservedEscrow() public {
        vm.expectRevert(TrainingJob.NotRequester.selector);
        vm.prank(outsider);
        job.close();
        uint256 id = _open(); // reserved
        uint256 before = requester.balance;
        vm.expectEmit(false, false, false, true, address(job));
        emit TrainingJob.JobClosedEvent(BUDGET - cost);
        vm.prank(requester);
        job.close();
        assertEq(requester.balance, before + BUDGET - cost, "unreserved refunded");
        assertTrue(job.closed(), "closed");
        assertEq(job.escrow(), cost, "the open lease's pay stays");
        vm.expectRevert(TrainingJob.JobClosed.selector);
        vm.prank(worker2);
        job.claim();

        // The open lease is rejected: its reservation is released, the slashed collateral is not escrow.
        _vote(job, v1, id, true);
        _rejectEarly(id);
        _finalizeNow(id);
        job.slashLoser(id, v1);
        vm.prank(requester);
        job.close();
        assertEq(requester.balance, before + BUDGET, "swept the released reservation, exactly the budget");
        assertEq(job.escrow(), 0, "no escrow");
        assertGt(job.poolHeld(), 0, "slashed value stays with the winners");
        vm.prank(requester);
        job.close(); // nothing more to sweep
        assertEq(requester.balance, before + BUDGET, "nothing more");
        _solvent();
    }

    function test_receive_onlyFromRegistry() public {
        address[3] memory senders = [outsider, requester, worker];
        for (uint256 i = 0; i < senders.length; ++i) {
            vm.prank(senders[i]);
            (bool ok, bytes memory ret) = address(job).call{value: 1 ether}("");
            assertFalse(ok, "refused");
            assertEq(bytes4(ret), TrainingJob.UnexpectedPayment.selector, "UnexpectedPayment");
        }
        assertEq(address(job).balance, BUDGET, "balance unchanged");
        // The registry's transfers (collateral taken at reclaim) are accepted.
        uint256 id = _claim(job, worker);
        _afterDeadline(id);
        job.reclaim(id);
        assertEq(address(job).balance, BUDGET + s.expiryFee, "from the registry");
        _solvent();
    }

    // ================================================================== fuzz: whole disputes

    /// @notice Random stakes, committee draws, votes and appeals: the job and registry stay solvent, the
    ///         outcome is the last round's, every loser can be slashed once, winners' claims never exceed the
    ///         pools, and all value not paid out is exactly what was burned (plus rounding dust).
    function testFuzz_dispute_settlesSolventlyAndConservesValue(uint256 pattern, uint256 extra1, uint256 extra2)
        public
    {
        extra1 = bound(extra1, 0, 20 ether);
        extra2 = bound(extra2, 0, 20 ether);
        if (extra1 > 0) {
            vm.prank(v1);
            registry.addStake{value: extra1}();
        }
        if (extra2 > 0) {
            vm.prank(v2);
            registry.addStake{value: extra2}();
        }
        _roll(1);
        address[] memory people = new address[](7);
        (people[0], people[1], people[2], people[3], people[4], people[5], people[6]) =
        (worker, worker2, v1, v2, v3, requester, outsider);
        uint256 wealthBefore;
        for (uint256 i = 0; i < people.length; ++i) {
            wealthBefore += _wealth(job, people[i]);
        }
        wealthBefore += address(job).balance;

        uint256 id = _open();
        for (uint256 r = 0; r <= s.appealRounds; ++r) {
            for (uint256 i = 0; i < vals.length; ++i) {
                uint256 choice = pattern % 3;
                pattern /= 3;
                if (choice == 0 || _status(job, id) != TrainingJob.Status.Voting) continue;
                if (job.memberWeight(id, r, vals[i]) == 0) continue;
                _vote(job, vals[i], id, choice == 1);
            }
            bool wantAppeal = pattern % 2 == 1;
            pattern /= 2;
            if (_status(job, id) == TrainingJob.Status.Voting) _afterDeadline(id);
            if (r == s.appealRounds || !wantAppeal) break;
            address appellant = people[pattern % 5];
            pattern /= 5;
            _appeal(job, appellant, id);
        }
        if (uint256(job.getLease(id).round) < s.appealRounds) {
            vm.warp(uint256(_deadline(job, id)) + s.appealWindow + 1);
        }
        job.finalize(id);
        TrainingJob.Outcome outcome = _outcome(job, id);
        TrainingJob.Status st = _status(job, id);
        if (outcome == TrainingJob.Outcome.Accept) assertEq(uint256(st), uint256(TrainingJob.Status.Paid), "paid");
        if (outcome == TrainingJob.Outcome.Reject) {
            assertEq(uint256(st), uint256(TrainingJob.Status.Slashed), "slashed");
        }
        if (outcome == TrainingJob.Outcome.Void) assertEq(uint256(st), uint256(TrainingJob.Status.Lapsed), "lapsed");
        _solvent();

        uint8 last = job.getLease(id).round;
        for (uint256 i = 0; i < vals.length; ++i) {
            try job.slashLoser(id, vals[i]) {} catch {}
            for (uint256 r = 0; r <= last; ++r) {
                try job.penalizeAbsent(id, r, vals[i]) {} catch {}
            }
        }
        for (uint256 i = 0; i < vals.length; ++i) {
            (bool again,) = address(job).call(abi.encodeCall(TrainingJob.slashLoser, (id, vals[i])));
            assertFalse(again, "a loser is slashed once per lease");
        }
        for (uint256 i = 0; i < people.length; ++i) {
            _cashOut(job, id, people[i]);
        }
        vm.prank(requester);
        job.close();
        _solvent();
        assertEq(job.totalOwed(), 0, "everything withdrawn");
        assertEq(job.bondsHeld(), 0, "no bonds left");
        assertEq(job.escrow(), 0, "escrow refunded or paid");
        assertLe(job.poolHeld(), 20, "only rounding dust left in the pools");
        assertEq(address(job).balance, job.burned() + job.poolHeld(), "the job keeps only the burn and dust");
        uint256 wealthAfter;
        for (uint256 i = 0; i < people.length; ++i) {
            wealthAfter += _wealth(job, people[i]);
        }
        assertEq(wealthBefore, wealthAfter + address(job).balance, "value only moves or burns");
        assertEq(_locked(worker), 0, "collateral released");
        if (outcome != TrainingJob.Outcome.Reject) {
            assertEq(_active(worker), STAKE, "worker keeps its stake unless rejected");
        } else {
            assertEq(_active(worker), STAKE - s.slashAmount, "rejected: collateral taken");
        }
        _solvent();
    }
}
