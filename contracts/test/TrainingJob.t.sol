// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Fixture} from "./Fixture.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {JobSpec} from "../src/Interfaces.sol";

/// @notice A contract account that acts through `exec` and refuses ether until told otherwise.
contract Puppet {
    bool public acceptEther;

    function setAcceptEther(bool a) external {
        acceptEther = a;
    }

    function exec(address target, uint256 value, bytes calldata data) external returns (bytes memory ret) {
        bool ok;
        (ok, ret) = target.call{value: value}(data);
        if (!ok) {
            assembly {
                revert(add(ret, 32), mload(ret))
            }
        }
    }

    receive() external payable {
        require(acceptEther, "no ether");
    }
}

/// @title TrainingJobTest
/// @notice The job's lease lifecycle: policy clock, claim/reclaim, submit, attest(Batch), lapse, challenge,
///         resolve, finalize, slashVoter, pull payments, close/refund and receive; plus fuzzed amounts and timing.
/// @dev Spec from Fixture: 4 completions x 2 tasks per lease at 0.001 ether (lease cost 0.008 ether), quorum 2,
///      staleness 2, lease 1h, vote 1h, challenge 1d, resolve 2d, slash 0.5 ether, bond 0.1 ether.
contract TrainingJobTest is Fixture {
    uint256 internal constant STAKE = 5 ether;
    uint256 internal constant BUDGET = 1 ether;
    uint256 internal constant T0 = 1_700_000_000;

    JobSpec internal s;
    TrainingJob internal job;
    uint256 internal cost;

    function setUp() public {
        _deploy();
        vm.warp(T0);
        vm.roll(100);
        _join(worker, WORKER, STAKE);
        _join(worker2, WORKER, STAKE);
        _join(v1, VALIDATOR, STAKE);
        _join(v2, VALIDATOR, STAKE);
        _join(v3, VALIDATOR, STAKE);
        s = _spec();
        job = _createJob(s, BUDGET);
        cost = _cost(s);
    }

    // ================================================================== full path

    function test_fullWorkerPath_claimSubmitAttestFinalizeWithdraw() public {
        uint256 id = _claim(job, worker);
        assertEq(job.reserved(), cost, "reserved on claim");
        _submit(job, worker, id, 0);
        _attest(job, v1, id, true);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Submitted), "one vote is not quorum");
        _attest(job, v2, id, true);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Accepted), "quorum accepts");
        uint64 challengeDeadline = _deadline(job, id);
        assertEq(uint256(challengeDeadline), block.timestamp + s.challengeWindow, "challenge deadline");

        vm.warp(uint256(challengeDeadline) + 1);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Settled(id, worker, true, cost);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "paid");
        assertEq(job.owed(worker), cost, "owed");
        assertEq(job.totalOwed(), cost, "totalOwed");
        assertEq(job.escrow(), BUDGET - cost, "escrow spent");
        assertEq(job.reserved(), 0, "reservation released");
        _assertJobSolvent(job);

        uint256 before = worker.balance;
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.PaymentWithdrawn(worker, cost);
        vm.prank(worker);
        job.withdrawPayment();
        assertEq(worker.balance, before + cost, "worker paid");
        assertEq(job.owed(worker), 0, "owed cleared");
        assertEq(job.totalOwed(), 0, "totalOwed cleared");
        assertEq(address(job).balance, BUDGET - cost, "job balance");
        assertEq(_active(worker), STAKE, "worker stake untouched");
        _assertJobSolvent(job);
    }

    // ================================================================== publishPolicy

    function test_publishPolicy_advancesClockAndStoresRoot() public {
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.PolicyPublished(1, bytes32(uint256(11)));
        vm.prank(trainer);
        job.publishPolicy(1, bytes32(uint256(11)));
        vm.prank(trainer);
        job.publishPolicy(5, bytes32(uint256(55))); // versions may skip
        assertEq(uint256(job.currentVersion()), 5, "currentVersion");
        assertEq(job.policyRoot(1), bytes32(uint256(11)), "root v1");
        assertEq(job.policyRoot(5), bytes32(uint256(55)), "root v5");
        assertEq(job.policyRoot(0), s.modelHash, "root v0 is base model");
    }

    function test_publishPolicy_revertsNotTrainer() public {
        vm.expectRevert(TrainingJob.NotTrainer.selector);
        vm.prank(requester);
        job.publishPolicy(1, bytes32(0));
        assertEq(uint256(job.currentVersion()), 0, "unchanged");
    }

    function test_publishPolicy_revertsVersionNotIncreasing_equalOrLower() public {
        vm.prank(trainer);
        job.publishPolicy(3, bytes32(0));
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotIncreasing.selector, uint64(3), uint64(3)));
        vm.prank(trainer);
        job.publishPolicy(3, bytes32(0));
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotIncreasing.selector, uint64(3), uint64(2)));
        vm.prank(trainer);
        job.publishPolicy(2, bytes32(0));
        TrainingJob fresh = _freshJob();
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotIncreasing.selector, uint64(0), uint64(0)));
        vm.prank(trainer);
        fresh.publishPolicy(0, bytes32(0));
    }

    // ================================================================== claim

    function test_claim_leasesTasksReservesAndEmits() public {
        vm.prevrandao(bytes32(uint256(0xabc)));
        bytes32 seed = keccak256(abi.encode(uint256(0xabc), blockhash(block.number - 1), address(job), uint256(1)));
        uint64 expiresAt = uint64(block.timestamp) + s.leaseDuration;
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.TaskClaimed(1, worker, 0, s.tasksPerLease, seed, expiresAt);
        uint256 id = _claim(job, worker);
        assertEq(id, 1, "first lease id");
        TrainingJob.Lease memory l = job.getLease(id);
        assertEq(l.worker, worker, "worker");
        assertEq(uint256(l.deadline), uint256(expiresAt), "deadline");
        assertEq(uint256(l.status), uint256(TrainingJob.Status.Leased), "status");
        assertEq(uint256(l.firstTask), 0, "firstTask");
        assertEq(l.seed, seed, "seed");
        assertEq(job.reserved(), cost, "reserved");
        assertEq(job.escrow(), BUDGET, "escrow unchanged");
        assertEq(uint256(job.nextTask()), s.tasksPerLease, "nextTask");
        assertEq(job.leaseCount(), 1, "leaseCount");

        uint256 id2 = _claim(job, worker2);
        assertEq(uint256(job.getLease(id2).firstTask), s.tasksPerLease, "second lease takes next tasks");
        assertEq(job.reserved(), 2 * cost, "two reservations");
    }

    function test_claim_revertsNotActive_unregistered() public {
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, outsider, WORKER));
        vm.prank(outsider);
        job.claim();
    }

    function test_claim_revertsNotActive_unstakedBelowMinimum() public {
        vm.prank(worker);
        registry.requestUnbond(STAKE - MIN_WORKER + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, worker, WORKER));
        vm.prank(worker);
        job.claim();
    }

    function test_claim_revertsNotActive_validatorOnlyNode() public {
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, v1, WORKER));
        vm.prank(v1);
        job.claim();
    }

    function test_claim_revertsInsufficientEscrow_whenBudgetReserved() public {
        TrainingJob small = _createJob(s, cost + cost / 2);
        _claim(small, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.InsufficientEscrow.selector, cost / 2, cost));
        vm.prank(worker2);
        small.claim();
        assertEq(small.reserved(), cost, "only one reservation");
    }

    function test_claim_revertsJobClosed() public {
        vm.prank(requester);
        job.close();
        vm.expectRevert(TrainingJob.JobClosed.selector);
        vm.prank(worker);
        job.claim();
    }

    function test_claim_leaseSeedsDiffer_sameBlockAndAcrossRandomness() public {
        uint256 a = _claim(job, worker);
        uint256 b = _claim(job, worker2);
        assertNotEq(job.getLease(a).seed, job.getLease(b).seed, "same block, different leases");
        vm.roll(block.number + 1);
        vm.prevrandao(bytes32(uint256(12345)));
        uint256 c = _claim(job, worker);
        vm.prevrandao(bytes32(uint256(67890)));
        uint256 d = _claim(job, worker);
        assertNotEq(job.getLease(c).seed, job.getLease(b).seed, "new block");
        assertNotEq(job.getLease(c).seed, job.getLease(d).seed, "different randomness");
        // Same randomness, same block, same lease id on another job: the job address separates them.
        TrainingJob other = _createJob(s, BUDGET);
        vm.prevrandao(bytes32(uint256(1)));
        uint256 e = _claim(job, worker);
        uint256 f1 = _claim(other, worker);
        assertNotEq(job.getLease(e).seed, other.getLease(f1).seed, "different jobs");
    }

    function test_claim_returnedTasksAreRequeuedAfterReclaim() public {
        uint256 a = _claim(job, worker); // tasks 0..1
        uint256 b = _claim(job, worker2); // tasks 2..3
        vm.warp(uint256(_deadline(job, a)) + 1);
        job.reclaim(a);
        job.reclaim(b);
        assertEq(job.reserved(), 0, "reservations released");
        assertEq(uint256(job.nextTask()), 2 * s.tasksPerLease, "nextTask unchanged by reclaim");
        uint256 c = _claim(job, worker);
        assertEq(uint256(job.getLease(c).firstTask), s.tasksPerLease, "last returned first (LIFO)");
        uint256 d = _claim(job, worker2);
        assertEq(uint256(job.getLease(d).firstTask), 0, "then the earlier returned batch");
        uint256 e = _claim(job, worker);
        assertEq(uint256(job.getLease(e).firstTask), 2 * s.tasksPerLease, "then fresh tasks");
        assertEq(uint256(job.nextTask()), 3 * s.tasksPerLease, "nextTask advanced once");
    }

    // ================================================================== reclaim

    function test_reclaim_returnsExpiredLease() public {
        uint256 id = _claim(job, worker);
        vm.warp(uint256(_deadline(job, id)) + 1);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.LeaseReturned(id, worker, 0);
        vm.prank(outsider); // anyone may reclaim
        job.reclaim(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Returned), "returned");
        assertEq(job.reserved(), 0, "released");
        assertEq(job.escrow(), BUDGET, "escrow intact");
    }

    function test_reclaim_revertsDeadlineNotReached_atDeadline() public {
        uint256 id = _claim(job, worker);
        uint64 deadline = _deadline(job, id);
        vm.warp(deadline);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, deadline));
        job.reclaim(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Leased), "still leased");
    }

    function test_reclaim_revertsWrongStatus_submittedOrReturned() public {
        uint256 id = _submitted(worker);
        vm.warp(block.timestamp + 1 days);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Submitted));
        job.reclaim(id);
        uint256 id2 = _claim(job, worker2);
        vm.warp(block.timestamp + 1 days);
        job.reclaim(id2);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id2, TrainingJob.Status.Returned));
        job.reclaim(id2);
    }

    function test_reclaim_revertsUnknownLease() public {
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnknownLease.selector, uint256(0)));
        job.reclaim(0);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnknownLease.selector, uint256(7)));
        job.reclaim(7);
    }

    // ================================================================== submit

    function test_submit_recordsBatchAndOpensVote() public {
        uint256 id = _claim(job, worker);
        vm.warp(block.timestamp + 10);
        bytes32 root = keccak256("batch");
        uint64 voteDeadline = uint64(block.timestamp) + s.voteWindow;
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.BatchSubmitted(id, worker, root, 0, voteDeadline);
        vm.prank(worker);
        job.submit(id, root, 0);
        TrainingJob.Lease memory l = job.getLease(id);
        assertEq(uint256(l.status), uint256(TrainingJob.Status.Submitted), "status");
        assertEq(l.root, root, "root");
        assertEq(uint256(l.policyVersion), 0, "version");
        assertEq(uint256(l.deadline), uint256(voteDeadline), "vote deadline");
    }

    function test_submit_revertsNotLeaseHolder() public {
        uint256 id = _claim(job, worker);
        vm.expectRevert(TrainingJob.NotLeaseHolder.selector);
        vm.prank(worker2);
        job.submit(id, bytes32(0), 0);
    }

    function test_submit_revertsWrongStatus_twice() public {
        uint256 id = _submitted(worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Submitted));
        vm.prank(worker);
        job.submit(id, bytes32(0), 0);
    }

    function test_submit_revertsLeaseExpired_oneSecondLate() public {
        uint256 id = _claim(job, worker);
        uint64 deadline = _deadline(job, id);
        vm.warp(uint256(deadline) + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.LeaseExpired.selector, id, deadline));
        vm.prank(worker);
        job.submit(id, bytes32(0), 0);
    }

    function test_submit_succeedsAtExactLeaseDeadline() public {
        uint256 id = _claim(job, worker);
        vm.warp(_deadline(job, id));
        _submit(job, worker, id, 0);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Submitted), "submitted at deadline");
    }

    function test_submit_revertsStalePolicy_beyondMaxStaleness() public {
        _publishTo(job, 5);
        uint256 id = _claim(job, worker);
        vm.expectRevert(
            abi.encodeWithSelector(TrainingJob.StalePolicy.selector, uint64(2), uint64(5), uint64(s.maxStaleness))
        );
        vm.prank(worker);
        job.submit(id, bytes32(0), 2);
    }

    function test_submit_succeedsAtExactlyStalenessBound() public {
        _publishTo(job, 5);
        uint256 id = _claim(job, worker);
        _submit(job, worker, id, 5 - uint64(s.maxStaleness));
        assertEq(uint256(job.getLease(id).policyVersion), 3, "version 3 = 5 - 2 admitted");
    }

    function test_submit_zeroStaleness_onlyCurrentVersion() public {
        JobSpec memory z = _spec();
        z.maxStaleness = 0;
        TrainingJob j = _createJob(z, BUDGET);
        _publishTo(j, 1);
        uint256 id = _claim(j, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.StalePolicy.selector, uint64(0), uint64(1), uint64(0)));
        vm.prank(worker);
        j.submit(id, bytes32(0), 0);
        _submit(j, worker, id, 1);
        assertEq(uint256(j.getLease(id).policyVersion), 1, "current admitted");
    }

    function test_submit_revertsFuturePolicy() public {
        _publishTo(job, 1);
        uint256 id = _claim(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.FuturePolicy.selector, uint64(2), uint64(1)));
        vm.prank(worker);
        job.submit(id, bytes32(0), 2);
    }

    function test_submit_nearMaxVersion_staleCheckDoesNotOverflow() public {
        // A version close to 2^64 must still be admissible: the staleness check may not overflow.
        uint64 top = type(uint64).max;
        vm.prank(trainer);
        job.publishPolicy(top, bytes32(0));
        uint256 id = _claim(job, worker);
        _submit(job, worker, id, top - 1);
        assertEq(uint256(job.getLease(id).policyVersion), uint256(top - 1), "admitted");
        uint256 id2 = _claim(job, worker2);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.StalePolicy.selector, uint64(0), top, uint64(2)));
        vm.prank(worker2);
        job.submit(id2, bytes32(0), 0);
    }

    function test_submit_revertsNotActive_whenWorkerUnbondedAfterClaim() public {
        uint256 id = _claim(job, worker);
        vm.prank(worker);
        registry.requestUnbond(STAKE);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, worker, WORKER));
        vm.prank(worker);
        job.submit(id, bytes32(0), 0);
    }

    // ================================================================== attest

    function test_attest_quorumDecidesAndEmits() public {
        uint256 id = _submitted(worker);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Attested(id, v1, false);
        _attest(job, v1, id, false);
        assertEq(uint256(job.votes(id, v1)), 2, "reject vote recorded");
        _attest(job, v2, id, true); // split: still open
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Submitted), "split is undecided");
        uint64 challengeDeadline = uint64(block.timestamp) + s.challengeWindow;
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.Decided(id, false, challengeDeadline);
        _attest(job, v3, id, false);
        TrainingJob.Lease memory l = job.getLease(id);
        assertEq(uint256(l.status), uint256(TrainingJob.Status.Rejected), "rejected");
        assertEq(uint256(l.rejectVotes), 2, "rejectVotes");
        assertEq(uint256(l.acceptVotes), 1, "acceptVotes");
        assertEq(uint256(l.deadline), uint256(challengeDeadline), "challenge deadline");
    }

    function test_attest_revertsWorkerCannotVote_onOwnBatch() public {
        address both = makeAddr("both");
        vm.deal(both, 100 ether);
        _join(both, BOTH, STAKE);
        uint256 id = _submitted(both);
        vm.expectRevert(TrainingJob.WorkerCannotVote.selector);
        vm.prank(both);
        job.attest(id, true);
    }

    function test_attest_revertsAlreadyVoted() public {
        uint256 id = _submitted(worker);
        _attest(job, v1, id, true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.AlreadyVoted.selector, id, v1));
        vm.prank(v1);
        job.attest(id, false);
    }

    function test_attest_revertsNotActive_nonValidator() public {
        uint256 id = _submitted(worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, worker2, VALIDATOR));
        vm.prank(worker2);
        job.attest(id, true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, outsider, VALIDATOR));
        vm.prank(outsider);
        job.attest(id, true);
    }

    function test_attest_revertsNotActive_validatorBelowMinimum() public {
        uint256 id = _submitted(worker);
        vm.prank(v1);
        registry.requestUnbond(STAKE - MIN_VALIDATOR + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, v1, VALIDATOR));
        vm.prank(v1);
        job.attest(id, true);
    }

    function test_attest_revertsDeadlinePassed() public {
        uint256 id = _submitted(worker);
        uint64 deadline = _deadline(job, id);
        vm.warp(deadline); // last second is still open
        _attest(job, v1, id, true);
        vm.warp(uint256(deadline) + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlinePassed.selector, id, deadline));
        vm.prank(v2);
        job.attest(id, true);
    }

    function test_attest_revertsWrongStatus_afterDecision() public {
        uint256 id = _decided(true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Accepted));
        vm.prank(v3);
        job.attest(id, false);
    }

    function test_attest_revertsWrongStatus_leasedNotSubmitted() public {
        uint256 id = _claim(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Leased));
        vm.prank(v1);
        job.attest(id, true);
    }

    function test_attest_revertsUnknownLease() public {
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnknownLease.selector, uint256(42)));
        vm.prank(v1);
        job.attest(42, true);
    }

    // ================================================================== attestBatch

    function test_attestBatch_votesOpenOnesAndSkipsDecided() public {
        uint256 a = _submitted(worker);
        uint256 b = _submitted(worker2);
        uint256 c = _submitted(worker);
        _attest(job, v1, b, true);
        _attest(job, v2, b, true); // b decided before v3's batch lands
        _attest(job, v1, c, true); // c: v3's vote will complete quorum

        uint256[] memory ids = new uint256[](3);
        bool[] memory acc = new bool[](3);
        (ids[0], ids[1], ids[2]) = (a, b, c);
        (acc[0], acc[1], acc[2]) = (true, false, true);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Attested(a, v3, true);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.AttestationSkipped(b, v3, TrainingJob.Status.Accepted);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Attested(c, v3, true);
        vm.prank(v3);
        job.attestBatch(ids, acc);

        assertEq(uint256(job.votes(a, v3)), 1, "voted a");
        assertEq(uint256(job.votes(b, v3)), 0, "skipped b");
        assertEq(uint256(_status(job, b)), uint256(TrainingJob.Status.Accepted), "b untouched");
        assertEq(uint256(_status(job, c)), uint256(TrainingJob.Status.Accepted), "c decided by the batch");
        assertEq(uint256(_status(job, a)), uint256(TrainingJob.Status.Submitted), "a still open");
    }

    function test_attestBatch_skipsAlreadyVotedAndPastDeadline() public {
        uint256 a = _submitted(worker);
        _attest(job, v1, a, true);
        uint256[] memory ids = new uint256[](1);
        bool[] memory acc = new bool[](1);
        ids[0] = a;
        acc[0] = false;
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.AttestationSkipped(a, v1, TrainingJob.Status.Submitted);
        vm.prank(v1);
        job.attestBatch(ids, acc);
        assertEq(uint256(job.votes(a, v1)), 1, "first vote kept");

        vm.warp(uint256(_deadline(job, a)) + 1);
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.AttestationSkipped(a, v2, TrainingJob.Status.Submitted);
        vm.prank(v2);
        job.attestBatch(ids, acc);
        assertEq(uint256(job.votes(a, v2)), 0, "late vote skipped");
    }

    function test_attestBatch_revertsLengthMismatch() public {
        uint256[] memory ids = new uint256[](2);
        bool[] memory acc = new bool[](1);
        vm.expectRevert(TrainingJob.LengthMismatch.selector);
        vm.prank(v1);
        job.attestBatch(ids, acc);
    }

    function test_attestBatch_revertsNotActive_nonValidator() public {
        uint256[] memory ids = new uint256[](0);
        bool[] memory acc = new bool[](0);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, worker, VALIDATOR));
        vm.prank(worker);
        job.attestBatch(ids, acc);
    }

    function test_attestBatch_revertsWorkerCannotVote_onOwnBatch() public {
        address both = makeAddr("both");
        vm.deal(both, 100 ether);
        _join(both, BOTH, STAKE);
        uint256 id = _submitted(both);
        uint256[] memory ids = new uint256[](1);
        bool[] memory acc = new bool[](1);
        ids[0] = id;
        vm.expectRevert(TrainingJob.WorkerCannotVote.selector);
        vm.prank(both);
        job.attestBatch(ids, acc);
    }

    // ================================================================== lapse

    function test_lapse_closesUndecidedBatchWithoutPayOrSlash() public {
        uint256 id = _submitted(worker);
        _attest(job, v1, id, true);
        _attest(job, v2, id, false);
        vm.warp(uint256(_deadline(job, id)) + 1);
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.Lapsed(id);
        job.lapse(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Lapsed), "lapsed");
        assertEq(job.reserved(), 0, "released");
        assertEq(job.escrow(), BUDGET, "no pay");
        assertEq(job.owed(worker), 0, "nothing owed");
        assertEq(_active(worker), STAKE, "no slash");
        _assertJobSolvent(job);
    }

    function test_lapse_revertsDeadlineNotReached_atDeadline() public {
        uint256 id = _submitted(worker);
        uint64 deadline = _deadline(job, id);
        vm.warp(deadline);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, deadline));
        job.lapse(id);
    }

    function test_lapse_revertsWrongStatus_decided() public {
        uint256 id = _decided(true);
        vm.warp(block.timestamp + 30 days);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Accepted));
        job.lapse(id);
    }

    // ================================================================== finalize

    function test_finalize_revertsDeadlineNotReached_atChallengeDeadline() public {
        uint256 id = _decided(true);
        uint64 deadline = _deadline(job, id);
        vm.warp(deadline);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, deadline));
        job.finalize(id);
    }

    function test_finalize_revertsWrongStatus_leasedAndPaid() public {
        uint256 id = _claim(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Leased));
        job.finalize(id);
        uint256 id2 = _decided(true);
        vm.warp(uint256(_deadline(job, id2)) + 1);
        job.finalize(id2);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id2, TrainingJob.Status.Paid));
        job.finalize(id2);
        assertEq(job.owed(worker), cost, "paid once");
    }

    function test_finalize_rejected_slashesWorkerIntoEscrow() public {
        uint256 id = _decided(false);
        vm.warp(uint256(_deadline(job, id)) + 1);
        uint256 regBefore = address(registry).balance;
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Settled(id, worker, false, 0);
        vm.expectEmit(true, true, false, true, address(registry));
        emit NodeRegistry.Slashed(worker, address(job), s.slashAmount, address(job), "rejected-batch");
        vm.expectEmit(false, false, false, true, address(job));
        emit TrainingJob.SlashReceived(s.slashAmount);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "slashed");
        assertEq(_active(worker), STAKE - s.slashAmount, "worker stake drops");
        assertEq(address(registry).balance, regBefore - s.slashAmount, "registry paid out");
        assertEq(job.escrow(), BUDGET + s.slashAmount, "escrow grows by the slash");
        assertEq(job.reserved(), 0, "released");
        assertEq(job.owed(worker), 0, "no pay");
        _assertJobSolvent(job);
        _assertRegistrySolvent();
    }

    function test_finalize_rejected_slashReachesUnbondingStake() public {
        uint256 id = _decided(false);
        vm.prank(worker);
        registry.requestUnbond(STAKE); // tries to flee after the rejection
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.finalize(id);
        assertEq(_unbonding(worker), STAKE - s.slashAmount, "slash reached unbonding stake");
        assertEq(job.escrow(), BUDGET + s.slashAmount, "escrow grows");
        _assertRegistrySolvent();
    }

    // ================================================================== challenge

    function test_challenge_postsBondAndOpensResolveWindow() public {
        uint256 id = _decided(true);
        uint64 resolveDeadline = uint64(block.timestamp) + s.resolveWindow;
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.Challenged(id, worker2, s.challengeBond, resolveDeadline);
        vm.prank(worker2);
        job.challenge{value: s.challengeBond}(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Challenged), "challenged");
        assertEq(job.bondsHeld(), s.challengeBond, "bondsHeld");
        (address ch, uint64 dl, bool origAccepted, bool overturned, bool resolved) = job.challenges(id);
        assertEq(ch, worker2, "challenger");
        assertEq(uint256(dl), uint256(resolveDeadline), "deadline");
        assertTrue(origAccepted, "original accepted");
        assertFalse(overturned, "not overturned");
        assertFalse(resolved, "not resolved");
        _assertJobSolvent(job);
    }

    function test_challenge_byValidator_atLastSecond() public {
        uint256 id = _decided(false);
        vm.warp(_deadline(job, id));
        vm.prank(v3);
        job.challenge{value: s.challengeBond}(id);
        (address ch,, bool origAccepted,,) = job.challenges(id);
        assertEq(ch, v3, "validator may challenge");
        assertFalse(origAccepted, "original rejected");
    }

    function test_challenge_revertsWrongBond() public {
        uint256 id = _decided(true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongBond.selector, s.challengeBond, s.challengeBond - 1));
        vm.prank(worker2);
        job.challenge{value: s.challengeBond - 1}(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongBond.selector, s.challengeBond, s.challengeBond + 1));
        vm.prank(worker2);
        job.challenge{value: s.challengeBond + 1}(id);
    }

    function test_challenge_revertsDeadlinePassed() public {
        uint256 id = _decided(true);
        uint64 deadline = _deadline(job, id);
        vm.warp(uint256(deadline) + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlinePassed.selector, id, deadline));
        vm.prank(worker2);
        job.challenge{value: s.challengeBond}(id);
    }

    function test_challenge_revertsVoterCannotChallenge_ownDecision() public {
        uint256 id = _decided(false);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VoterCannotChallenge.selector, id, v1));
        vm.prank(v1);
        job.challenge{value: s.challengeBond}(id);
        assertEq(job.bondsHeld(), 0, "no bond taken");
    }

    function test_challenge_revertsNotActive_unstakedChallenger() public {
        uint256 id = _decided(true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, outsider, BOTH));
        vm.prank(outsider);
        job.challenge{value: s.challengeBond}(id);
    }

    function test_challenge_revertsWrongStatus_undecidedOrAlreadyChallenged() public {
        uint256 id = _submitted(worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Submitted));
        vm.prank(worker2);
        job.challenge{value: s.challengeBond}(id);
        uint256 id2 = _decided(true);
        vm.prank(worker2);
        job.challenge{value: s.challengeBond}(id2);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id2, TrainingJob.Status.Challenged));
        vm.prank(v3);
        job.challenge{value: s.challengeBond}(id2);
    }

    // ================================================================== resolve

    function test_resolve_revertsNotArbiter() public {
        uint256 id = _challenged(true, worker2);
        vm.expectRevert(TrainingJob.NotArbiter.selector);
        vm.prank(requester);
        job.resolve(id, false);
    }

    function test_resolve_revertsWrongStatus_notChallenged() public {
        uint256 id = _decided(true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.WrongStatus.selector, id, TrainingJob.Status.Accepted));
        vm.prank(arbiter);
        job.resolve(id, false);
    }

    function test_resolve_revertsDeadlinePassed() public {
        uint256 id = _challenged(true, worker2);
        (, uint64 deadline,,,) = job.challenges(id);
        vm.warp(uint256(deadline) + 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlinePassed.selector, id, deadline));
        vm.prank(arbiter);
        job.resolve(id, false);
    }

    function test_resolve_overturnAccepted_returnsBondSlashesWorkerAndEnablesSlashVoter() public {
        uint256 id = _challenged(true, worker2); // v1, v2 voted accept
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.ChallengeResolved(id, false, true);
        vm.prank(arbiter);
        job.resolve(id, false);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "final outcome: rejected");
        assertEq(job.owed(worker2), s.challengeBond, "bond returned to challenger");
        assertEq(job.bondsHeld(), 0, "no bond held");
        assertEq(_active(worker), STAKE - s.slashAmount, "worker slashed");
        assertEq(job.escrow(), BUDGET + s.slashAmount, "slash into escrow");
        (,,, bool overturned, bool resolved) = job.challenges(id);
        assertTrue(overturned && resolved, "overturned + resolved");

        uint256 before = worker2.balance;
        vm.expectEmit(true, true, false, true, address(job));
        emit TrainingJob.VoterSlashed(id, v1, s.slashAmount);
        vm.prank(outsider); // anyone may trigger
        job.slashVoter(id, v1);
        job.slashVoter(id, v2);
        assertEq(_active(v1), STAKE - s.slashAmount, "v1 slashed");
        assertEq(_active(v2), STAKE - s.slashAmount, "v2 slashed");
        assertEq(worker2.balance, before + 2 * s.slashAmount, "slashed stake goes to the challenger");
        assertEq(uint256(job.votes(id, v1)), 3, "marked slashed");
        _assertJobSolvent(job);
        _assertRegistrySolvent();
    }

    function test_resolve_overturnRejected_paysWorkerAndSlashesRejectVoters() public {
        uint256 id = _challenged(false, worker); // worker disputes its own rejection
        vm.prank(arbiter);
        job.resolve(id, true);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "paid");
        assertEq(job.owed(worker), cost + s.challengeBond, "pay + bond back");
        assertEq(_active(worker), STAKE, "worker not slashed");
        uint256 before = worker.balance;
        job.slashVoter(id, v1);
        assertEq(worker.balance, before + s.slashAmount, "challenger receives the voter's stake");
        assertEq(_active(v1), STAKE - s.slashAmount, "v1 slashed");
        _assertJobSolvent(job);
    }

    function test_resolve_upheld_sendsBondToEscrowAndSettles() public {
        uint256 id = _challenged(true, worker2);
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.ChallengeResolved(id, true, false);
        vm.prank(arbiter);
        job.resolve(id, true);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "paid");
        assertEq(job.owed(worker2), 0, "no bond back");
        assertEq(job.owed(worker), cost, "worker paid");
        assertEq(job.escrow(), BUDGET - cost + s.challengeBond, "bond into escrow");
        assertEq(job.bondsHeld(), 0, "bondsHeld");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, v1));
        job.slashVoter(id, v1);
        _assertJobSolvent(job);
    }

    function test_resolve_upheldRejection_slashesWorker() public {
        uint256 id = _challenged(false, worker);
        vm.prank(arbiter);
        job.resolve(id, false);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "slashed");
        assertEq(_active(worker), STAKE - s.slashAmount, "worker slashed");
        assertEq(job.escrow(), BUDGET + s.challengeBond + s.slashAmount, "bond + slash into escrow");
        _assertJobSolvent(job);
    }

    function test_resolve_defaultArbiterIsRequester() public {
        JobSpec memory d = _spec();
        d.arbiter = address(0);
        TrainingJob j = _createJob(d, BUDGET);
        uint256 id = _claim(j, worker);
        _submit(j, worker, id, 0);
        _attest(j, v1, id, true);
        _attest(j, v2, id, true);
        vm.prank(worker2);
        j.challenge{value: d.challengeBond}(id);
        vm.expectRevert(TrainingJob.NotArbiter.selector);
        vm.prank(arbiter);
        j.resolve(id, false);
        vm.prank(requester);
        j.resolve(id, false);
        assertEq(uint256(_status(j, id)), uint256(TrainingJob.Status.Slashed), "requester resolved");
    }

    // ================================================================== finalize of a challenge

    function test_finalize_unresolvedChallengeAfterResolveWindow_returnsBond() public {
        uint256 id = _challenged(true, worker2);
        (, uint64 deadline,,,) = job.challenges(id);
        vm.warp(deadline);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, deadline));
        job.finalize(id);
        vm.warp(uint256(deadline) + 1);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "original outcome stands");
        assertEq(job.owed(worker2), s.challengeBond, "bond returned");
        assertEq(job.owed(worker), cost, "worker paid");
        assertEq(job.bondsHeld(), 0, "bondsHeld");
        (,,, bool overturned, bool resolved) = job.challenges(id);
        assertTrue(resolved && !overturned, "closed, not overturned");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, v1));
        job.slashVoter(id, v1);
        _assertJobSolvent(job);
    }

    function test_finalize_unresolvedChallengeOfRejection_slashesWorker() public {
        uint256 id = _challenged(false, worker);
        (, uint64 deadline,,,) = job.challenges(id);
        vm.warp(uint256(deadline) + 1);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "rejection stands");
        assertEq(job.owed(worker), s.challengeBond, "bond back");
        assertEq(_active(worker), STAKE - s.slashAmount, "slashed");
        _assertJobSolvent(job);
    }

    // ================================================================== slashVoter

    function test_slashVoter_revertsNotSlashable_forWinner() public {
        uint256 id = _submitted(worker);
        _attest(job, v3, id, false); // v3 on the side that will win after the overturn
        _attest(job, v1, id, true);
        _attest(job, v2, id, true);
        vm.prank(worker2);
        job.challenge{value: s.challengeBond}(id);
        vm.prank(arbiter);
        job.resolve(id, false);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, v3));
        job.slashVoter(id, v3);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, outsider));
        job.slashVoter(id, outsider); // never voted
        assertEq(_active(v3), STAKE, "winner keeps stake");
    }

    function test_slashVoter_revertsNotSlashable_notOverturnedOrUnchallenged() public {
        uint256 id = _decided(true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, v1));
        job.slashVoter(id, v1); // never challenged
        vm.prank(worker2);
        job.challenge{value: s.challengeBond}(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, v1));
        job.slashVoter(id, v1); // challenged, unresolved
        vm.prank(arbiter);
        job.resolve(id, true);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, v1));
        job.slashVoter(id, v1); // upheld
        assertEq(_active(v1), STAKE, "stake kept");
    }

    function test_slashVoter_revertsNotSlashable_twice() public {
        uint256 id = _challenged(true, worker2);
        vm.prank(arbiter);
        job.resolve(id, false);
        job.slashVoter(id, v1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, id, v1));
        job.slashVoter(id, v1);
        assertEq(_active(v1), STAKE - s.slashAmount, "slashed once");
    }

    // ================================================================== close / refund

    function test_close_revertsNotRequester() public {
        vm.expectRevert(TrainingJob.NotRequester.selector);
        vm.prank(outsider);
        job.close();
        assertFalse(job.closed(), "still open");
    }

    function test_close_refundsOnlyUnreservedEscrow_thenSweepsReleased() public {
        uint256 paid = _claim(job, worker);
        uint256 rejected = _claim(job, worker2);
        uint256 before = requester.balance;
        vm.expectEmit(false, false, false, true, address(job));
        emit TrainingJob.JobClosedEvent(BUDGET - 2 * cost);
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.EscrowRefunded(requester, BUDGET - 2 * cost);
        vm.prank(requester);
        job.close();
        assertTrue(job.closed(), "closed");
        assertEq(requester.balance, before + BUDGET - 2 * cost, "refund of the free part");
        assertEq(job.escrow(), 2 * cost, "reserved kept");
        assertEq(job.reserved(), 2 * cost, "reserved");
        _assertJobSolvent(job);

        // Open leases still run to completion after closing.
        _submit(job, worker, paid, 0);
        _submit(job, worker2, rejected, 0);
        _attest(job, v1, paid, true);
        _attest(job, v2, paid, true);
        _attest(job, v1, rejected, false);
        _attest(job, v2, rejected, false);
        vm.warp(block.timestamp + s.challengeWindow + 1);
        job.finalize(paid);
        job.finalize(rejected);
        assertEq(job.owed(worker), cost, "worker still paid after close");

        before = requester.balance;
        vm.prank(requester);
        job.close(); // sweep what the rejected lease released, plus the slash
        assertEq(requester.balance, before + cost + s.slashAmount, "second sweep");
        assertEq(job.escrow(), 0, "escrow empty");
        assertEq(address(job).balance, cost, "only the owed pay remains");
        _assertJobSolvent(job);

        vm.prank(worker);
        job.withdrawPayment();
        assertEq(address(job).balance, 0, "job drained");
    }

    function test_close_secondCallDoesNotReemitClosed() public {
        vm.prank(requester);
        job.close();
        vm.expectEmit(true, false, false, true, address(job));
        emit TrainingJob.EscrowRefunded(requester, 0);
        vm.prank(requester);
        job.close();
        assertEq(job.escrow(), 0, "nothing left");
    }

    // ================================================================== receive / withdrawPayment

    function test_receive_revertsUnexpectedPayment_fromAnyoneButRegistry() public {
        address[3] memory senders = [outsider, requester, address(factory)];
        for (uint256 i = 0; i < senders.length; ++i) {
            vm.deal(senders[i], 1 ether);
            vm.expectRevert(TrainingJob.UnexpectedPayment.selector);
            vm.prank(senders[i]);
            (bool ok,) = address(job).call{value: 1 ether}("");
            ok; // the low-level call's revert is what expectRevert checks
        }
        assertEq(job.escrow(), BUDGET, "escrow unchanged");
    }

    function test_receive_fromRegistry_addsToEscrow() public {
        vm.deal(address(registry), address(registry).balance + 1 ether);
        vm.expectEmit(false, false, false, true, address(job));
        emit TrainingJob.SlashReceived(1 ether);
        vm.prank(address(registry));
        (bool ok,) = address(job).call{value: 1 ether}("");
        assertTrue(ok, "registry may pay");
        assertEq(job.escrow(), BUDGET + 1 ether, "escrow grows");
        _assertJobSolvent(job);
    }

    function test_withdrawPayment_revertsNothingOwed() public {
        vm.expectRevert(TrainingJob.NothingOwed.selector);
        vm.prank(worker);
        job.withdrawPayment();
    }

    function test_withdrawPayment_revertsNothingOwed_afterWithdrawing() public {
        uint256 id = _decided(true);
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.finalize(id);
        vm.prank(worker);
        job.withdrawPayment();
        vm.expectRevert(TrainingJob.NothingOwed.selector);
        vm.prank(worker);
        job.withdrawPayment();
        assertEq(job.totalOwed(), 0, "totalOwed");
    }

    // ================================================================== failed transfers

    function test_withdrawPayment_revertsTransferFailed_keepsOwedForRetry() public {
        Puppet p = new Puppet();
        vm.deal(address(p), 10 ether);
        p.exec(address(registry), STAKE, abi.encodeCall(NodeRegistry.join, (hex"0024c0de", WORKER)));
        uint256 id = abi.decode(p.exec(address(job), 0, abi.encodeCall(TrainingJob.claim, ())), (uint256));
        p.exec(address(job), 0, abi.encodeCall(TrainingJob.submit, (id, bytes32("r"), 0)));
        _attest(job, v1, id, true);
        _attest(job, v2, id, true);
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.finalize(id);
        vm.expectRevert(TrainingJob.TransferFailed.selector);
        p.exec(address(job), 0, abi.encodeCall(TrainingJob.withdrawPayment, ()));
        assertEq(job.owed(address(p)), cost, "still owed after the failed transfer");
        p.setAcceptEther(true);
        uint256 before = address(p).balance;
        p.exec(address(job), 0, abi.encodeCall(TrainingJob.withdrawPayment, ()));
        assertEq(address(p).balance, before + cost, "paid on retry");
    }

    function test_close_revertsTransferFailed_whenRequesterRejectsEther() public {
        Puppet p = new Puppet();
        vm.deal(address(p), 10 ether);
        JobSpec memory spec_ = _spec();
        TrainingJob j = TrainingJob(
            payable(abi.decode(p.exec(address(factory), BUDGET, abi.encodeCall(factory.createJob, (spec_))), (address)))
        );
        vm.expectRevert(TrainingJob.TransferFailed.selector);
        p.exec(address(j), 0, abi.encodeCall(TrainingJob.close, ()));
        assertFalse(j.closed(), "close rolled back");
        assertEq(j.escrow(), BUDGET, "escrow kept");
    }

    function test_slashVoter_revertsTransferFailed_whenChallengerRejectsEther() public {
        Puppet p = new Puppet();
        vm.deal(address(p), 10 ether);
        p.exec(address(registry), STAKE, abi.encodeCall(NodeRegistry.join, (hex"0024c0de", WORKER)));
        uint256 id = _decided(true);
        p.exec(address(job), s.challengeBond, abi.encodeCall(TrainingJob.challenge, (id)));
        vm.prank(arbiter);
        job.resolve(id, false);
        vm.expectRevert(NodeRegistry.TransferFailed.selector);
        job.slashVoter(id, v1);
        assertEq(_active(v1), STAKE, "slash rolled back");
        p.setAcceptEther(true);
        job.slashVoter(id, v1);
        assertEq(address(p).balance, 10 ether - STAKE - s.challengeBond + s.slashAmount, "challenger paid");
    }

    // ================================================================== fuzz

    function testFuzz_claim_reservesUntilBudgetExhausted(uint256 reward, uint256 leases, uint256 extra) public {
        JobSpec memory f = _spec();
        f.rewardPerSample = bound(reward, 1, 0.1 ether);
        uint256 c = _cost(f);
        leases = bound(leases, 1, 12);
        extra = bound(extra, 0, c - 1);
        uint256 budget = c * leases + extra;
        TrainingJob j = _createJob(f, budget);
        for (uint256 i = 0; i < leases; ++i) {
            _claim(j, i % 2 == 0 ? worker : worker2);
        }
        assertEq(j.reserved(), c * leases, "reserved");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.InsufficientEscrow.selector, extra, c));
        vm.prank(worker);
        j.claim();
        _assertJobSolvent(j);
    }

    function testFuzz_acceptedLeasePaysExactlyLeaseCost(uint256 reward, uint32 group, uint32 tasks) public {
        JobSpec memory f = _spec();
        f.rewardPerSample = bound(reward, 1, 0.01 ether);
        f.groupSize = uint32(bound(group, 1, 64));
        f.tasksPerLease = uint32(bound(tasks, 1, 32));
        uint256 c = _cost(f);
        TrainingJob j = _createJob(f, c);
        uint256 id = _claim(j, worker);
        _submit(j, worker, id, 0);
        _attest(j, v1, id, true);
        _attest(j, v2, id, true);
        vm.warp(uint256(_deadline(j, id)) + 1);
        j.finalize(id);
        uint256 before = worker.balance;
        vm.prank(worker);
        j.withdrawPayment();
        assertEq(worker.balance - before, c, "paid lease cost");
        assertEq(j.escrow(), 0, "budget spent");
        assertEq(address(j).balance, 0, "job empty");
    }

    function testFuzz_slashAmount_cappedByStake(uint256 slashAmount) public {
        JobSpec memory f = _spec();
        f.slashAmount = bound(slashAmount, 0, 3 * STAKE);
        TrainingJob j = _createJob(f, BUDGET);
        uint256 id = _claim(j, worker);
        _submit(j, worker, id, 0);
        _attest(j, v1, id, false);
        _attest(j, v2, id, false);
        vm.warp(uint256(_deadline(j, id)) + 1);
        j.finalize(id);
        uint256 taken = f.slashAmount < STAKE ? f.slashAmount : STAKE;
        assertEq(_active(worker), STAKE - taken, "stake");
        assertEq(j.escrow(), BUDGET + taken, "escrow");
        _assertJobSolvent(j);
        _assertRegistrySolvent();
    }

    function testFuzz_leaseTiming_submitOrReclaimAroundDeadline(uint256 dt) public {
        dt = bound(dt, 0, 2 * uint256(s.leaseDuration));
        uint256 id = _claim(job, worker);
        uint64 deadline = _deadline(job, id);
        vm.warp(block.timestamp + dt);
        if (block.timestamp <= deadline) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, deadline));
            job.reclaim(id);
            _submit(job, worker, id, 0);
            assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Submitted), "in time");
        } else {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.LeaseExpired.selector, id, deadline));
            vm.prank(worker);
            job.submit(id, bytes32(0), 0);
            job.reclaim(id);
            assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Returned), "expired");
            assertEq(job.reserved(), 0, "released");
        }
    }

    function testFuzz_voteAndChallengeTiming(uint256 voteAt, uint256 challengeAt) public {
        uint256 id = _submitted(worker);
        uint64 voteDeadline = _deadline(job, id);
        voteAt = bound(voteAt, 0, 2 * uint256(s.voteWindow));
        vm.warp(block.timestamp + voteAt);
        if (block.timestamp > voteDeadline) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlinePassed.selector, id, voteDeadline));
            vm.prank(v1);
            job.attest(id, true);
            job.lapse(id);
            assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Lapsed), "lapsed");
            return;
        }
        _attest(job, v1, id, true);
        _attest(job, v2, id, true);
        uint64 challengeDeadline = _deadline(job, id);
        challengeAt = bound(challengeAt, 0, 2 * uint256(s.challengeWindow));
        vm.warp(block.timestamp + challengeAt);
        if (block.timestamp > challengeDeadline) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlinePassed.selector, id, challengeDeadline));
            vm.prank(worker2);
            job.challenge{value: s.challengeBond}(id);
            job.finalize(id);
            assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "finalized");
        } else {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.DeadlineNotReached.selector, id, challengeDeadline));
            job.finalize(id);
            vm.prank(worker2);
            job.challenge{value: s.challengeBond}(id);
            assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Challenged), "challenged");
        }
        _assertJobSolvent(job);
    }

    function testFuzz_submit_staleness(uint32 maxStaleness, uint64 current, uint64 version) public {
        JobSpec memory f = _spec();
        f.maxStaleness = uint32(bound(maxStaleness, 0, 64));
        TrainingJob j = _createJob(f, BUDGET);
        current = uint64(bound(current, 0, type(uint64).max));
        if (current > 0) {
            vm.prank(trainer);
            j.publishPolicy(current, bytes32(uint256(current)));
        }
        // Mostly probe near the admissible window's edges.
        if (version % 4 != 0 && current > 0) {
            uint256 lo = current > 70 ? current - 70 : 0;
            version = uint64(bound(version, lo, uint256(current) + 2 > type(uint64).max ? current : current + 2));
        }
        uint256 id = _claim(j, worker);
        if (version > current) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.FuturePolicy.selector, version, current));
            vm.prank(worker);
            j.submit(id, bytes32(0), version);
        } else if (uint256(current) - version > f.maxStaleness) {
            vm.expectRevert(
                abi.encodeWithSelector(TrainingJob.StalePolicy.selector, version, current, uint64(f.maxStaleness))
            );
            vm.prank(worker);
            j.submit(id, bytes32(0), version);
        } else {
            _submit(j, worker, id, version);
            assertEq(uint256(j.getLease(id).policyVersion), uint256(version), "admitted");
        }
        assertEq(
            uint256(_status(j, id)),
            uint256(
                version <= current && uint256(current) - version <= f.maxStaleness
                    ? TrainingJob.Status.Submitted
                    : TrainingJob.Status.Leased
            ),
            "status matches admission rule"
        );
    }

    // ================================================================== helpers

    function _freshJob() internal returns (TrainingJob) {
        return _createJob(s, BUDGET);
    }

    function _publishTo(TrainingJob j, uint64 version) internal {
        vm.prank(trainer);
        j.publishPolicy(version, bytes32(uint256(version)));
    }

    function _submitted(address w) internal returns (uint256 id) {
        id = _claim(job, w);
        _submit(job, w, id, job.currentVersion());
    }

    /// @dev A batch by `worker`, decided by v1 and v2 voting `accept`.
    function _decided(bool accept) internal returns (uint256 id) {
        id = _submitted(worker);
        _attest(job, v1, id, accept);
        _attest(job, v2, id, accept);
    }

    function _challenged(bool accept, address challenger) internal returns (uint256 id) {
        id = _decided(accept);
        vm.prank(challenger);
        job.challenge{value: s.challengeBond}(id);
    }
}
