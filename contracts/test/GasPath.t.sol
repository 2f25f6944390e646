// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Fixture} from "./Fixture.sol";
import {Gas} from "./TestBase.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {JobSpec} from "../src/Interfaces.sol";

/// @title GasPathTest
/// @notice Gas of one worker lease on the happy path with realistic parameters (8 completions x 8 tasks per
///         lease; three equal validators, committee size 3, so two matching votes decide round 0 early):
///         claim (locks collateral), drawSeed, submit, vote (first: draws the committee), vote (decides),
///         finalize (pays, releases collateral), withdrawPayment.
/// @dev Invariant: every step is measured in its own test, i.e. its own transaction, on a lease that setUp
///      left in the right stage of a job that has been running a while, so storage is priced as on chain
///      (cold slots, EIP-2200 original values from committed state). Measuring the whole path inside one test
///      would under-price it: slots written earlier in the same transaction are "dirty" and cost 100 gas.
///      Each test logs `tx <step>`: what the transaction costs (21000 + calldata + execution - refund, the
///      refund capped at a fifth, with the EIP-7623 calldata floor), and checks it against a generous ceiling.
///      `script/gas_report.sh` sums the `tx` lines into the per-lease and per-accepted-sample cost.
contract GasPathTest is Fixture {
    uint32 internal constant GROUP = 8;
    uint32 internal constant TASKS = 8;

    TrainingJob internal job;
    JobSpec internal s;

    // Leases setUp leaves at each stage of the path.
    uint256 internal leaseToSeed;
    uint256 internal leaseToSubmit;
    uint256 internal leaseToVote;
    uint256 internal leaseToDecide;
    uint256 internal leaseToFinalize;

    /// @notice The last measurement: gas of the whole transaction.
    uint256 public lastTx;

    function setUp() public {
        _deploy();
        vm.warp(1_700_000_000);
        vm.roll(1000);
        _join(worker, WORKER, 4 ether);
        _join(worker2, WORKER, 2 ether);
        _join(v1, VALIDATOR, 4 ether);
        _join(v2, VALIDATOR, 4 ether);
        _join(v3, VALIDATOR, 4 ether);
        _roll(1);
        s = _spec();
        s.groupSize = GROUP;
        s.tasksPerLease = TASKS;
        s.committeeSize = 3;
        s.rewardPerSample = 0.0001 ether;
        job = _createJob(s, 10 ether);
        vm.prank(trainer);
        job.publishPolicy(1, keccak256("v1"));

        // Leases already paid to worker2 and to a third worker and left unwithdrawn, so counters and
        // totalOwed stay non-zero when worker2 withdraws (steady state of a running job).
        address worker3 = makeAddr("worker3");
        vm.deal(worker3, 10 ether);
        _join(worker3, WORKER, 2 ether);
        uint256 w = _claimReady(job, worker2);
        uint256 w3 = _claimReady(job, worker3);
        _submit(job, worker2, w, 1);
        _submit(job, worker3, w3, 1);
        _vote(job, v1, w, true);
        _vote(job, v2, w, true);
        _vote(job, v1, w3, true);
        _vote(job, v2, w3, true);
        vm.warp(uint256(_deadline(job, w3)) + 1);
        job.finalize(w);
        job.finalize(w3);

        // The lease to finalize: accepted, its appeal window over.
        leaseToFinalize = _claimReady(job, worker);
        _submit(job, worker, leaseToFinalize, 1);
        _vote(job, v1, leaseToFinalize, true);
        _vote(job, v2, leaseToFinalize, true);
        vm.warp(uint256(_deadline(job, leaseToFinalize)) + 1);

        // Fresh leases (their deadlines start now) at the earlier stages.
        leaseToSeed = _claim(job, worker);
        leaseToSubmit = _claimReady(job, worker);
        leaseToVote = _claimReady(job, worker);
        _submit(job, worker, leaseToVote, 1);
        leaseToDecide = _claimReady(job, worker);
        _submit(job, worker, leaseToDecide, 1);
        _vote(job, v1, leaseToDecide, true);
        _roll(1);
    }

    function test_gas_1_claim() public {
        // Read nothing from the job before measuring: it would warm the implementation's address.
        _measure("claim", worker2, abi.encodeCall(TrainingJob.claim, ()));
        assertLt(lastTx, 200_000, "claim ceiling");
        uint256 id = job.leaseCount();
        assertEq(job.getLease(id).worker, worker2, "claimed");
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Leased), "leased");
        assertEq(_locked(worker2), s.slashAmount, "collateral locked");
    }

    function test_gas_2_drawSeed() public {
        _measure("drawSeed", worker, abi.encodeCall(TrainingJob.drawSeed, (leaseToSeed)));
        assertLt(lastTx, 80_000, "drawSeed ceiling");
        assertNotEq(job.getLease(leaseToSeed).seed, bytes32(0), "seed drawn");
    }

    function test_gas_3_submit() public {
        bytes32 root = keccak256("merkle root over 64 rollouts");
        _measure("submit", worker, abi.encodeCall(TrainingJob.submit, (leaseToSubmit, root, 1)));
        assertLt(lastTx, 120_000, "submit ceiling");
        assertEq(job.getLease(leaseToSubmit).root, root, "submitted");
    }

    function test_gas_4_voteFirst() public {
        _measure("vote (first)", v1, abi.encodeCall(TrainingJob.vote, (leaseToVote, true)));
        assertLt(lastTx, 150_000, "vote ceiling");
        assertEq(job.ballots(leaseToVote, v1), 1, "voted");
        assertEq(uint256(_status(job, leaseToVote)), uint256(TrainingJob.Status.Voting), "not yet decided");
    }

    function test_gas_5_voteDeciding() public {
        _measure("vote (deciding)", v2, abi.encodeCall(TrainingJob.vote, (leaseToDecide, true)));
        assertLt(lastTx, 120_000, "deciding vote ceiling");
        assertEq(uint256(_status(job, leaseToDecide)), uint256(TrainingJob.Status.Decided), "decided");
        assertEq(uint256(_outcome(job, leaseToDecide)), uint256(TrainingJob.Outcome.Accept), "accepted");
    }

    function test_gas_6_finalize() public {
        _measure("finalize", outsider, abi.encodeCall(TrainingJob.finalize, (leaseToFinalize)));
        assertLt(lastTx, 150_000, "finalize ceiling");
        assertEq(uint256(_status(job, leaseToFinalize)), uint256(TrainingJob.Status.Paid), "paid");
        assertEq(job.owed(worker), job.leaseCost(), "credited");
    }

    function test_gas_7_withdrawPayment() public {
        uint256 before = worker2.balance;
        _measure("withdrawPayment", worker2, abi.encodeCall(TrainingJob.withdrawPayment, ()));
        assertLt(lastTx, 70_000, "withdrawPayment ceiling");
        assertEq(worker2.balance, before + job.leaseCost(), "paid out");
    }

    /// @notice The whole path back to back on one lease: the measured steps compose (no gas numbers here).
    function test_gasPath_oneAcceptedLease_endToEnd() public {
        uint256 lockedBefore = _locked(worker);
        uint256 id = _claimReady(job, worker);
        _submit(job, worker, id, 1);
        _vote(job, v1, id, true);
        _vote(job, v2, id, true);
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.finalize(id);
        uint256 before = worker.balance;
        vm.prank(worker);
        job.withdrawPayment();
        assertGe(worker.balance, before + job.leaseCost(), "at least this lease paid");
        assertEq(job.leaseCost(), uint256(GROUP) * TASKS * s.rewardPerSample, "64 samples paid");
        assertEq(_locked(worker), lockedBefore, "collateral released");
        _assertJobSolvent(job);
        _assertRegistrySolvent();
    }

    /// @notice Validators amortise the transaction overhead with voteBatch: 8 leases in one transaction.
    function test_gas_8_voteBatchOfEight() public {
        uint256 n = 8;
        uint256[] memory ids = new uint256[](n);
        bool[] memory acc = new bool[](n);
        address worker4 = makeAddr("worker4");
        vm.deal(worker4, 100 ether);
        _join(worker4, WORKER, 10 ether);
        for (uint256 i = 0; i < n; ++i) {
            ids[i] = _claimReady(job, worker4);
            _submit(job, worker4, ids[i], 1);
            _vote(job, v1, ids[i], true);
            acc[i] = true;
        }
        // The same-transaction setup above dirtied shared slots; the per-lease vote slots are fresh.
        _measure("voteBatch (8 deciding votes)", v2, abi.encodeCall(TrainingJob.voteBatch, (ids, acc)));
        for (uint256 i = 0; i < n; ++i) {
            assertEq(uint256(_status(job, ids[i])), uint256(TrainingJob.Status.Decided), "all decided");
        }
        emit log_named_uint("tx voteBatch per lease", lastTx / n);
        assertLt(lastTx / n, 80_000, "batched vote ceiling per lease");
    }

    // ------------------------------------------------------------------ measuring

    /// @dev Run `data` on the job as `who` with the job's and registry's storage cold, as in a fresh
    ///      transaction, and log what the transaction costs. Under `--isolate` (which `--gas-report` turns on)
    ///      forge runs the call as a real transaction and the measured gas already includes the intrinsic gas,
    ///      calldata and refund; otherwise they are added here.
    function _measure(string memory name, address who, bytes memory data) internal {
        bool isolated = _isolated();
        vm.cool(address(job));
        vm.cool(address(registry));
        vm.cool(address(implementation));
        // A transaction's target and sender are warm from the start: re-warm the two addresses (not their slots).
        uint256 warm = address(job).balance + who.balance;
        warm;
        vm.prank(who);
        uint256 g = gasleft();
        (bool ok,) = address(job).call(data);
        uint256 measured = g - gasleft();
        require(ok, "measured call reverted");
        uint256 used = measured;
        if (!isolated) {
            Gas memory rec = vm.lastCallGas();
            uint256 refund = rec.gasRefunded > 0 ? uint256(int256(rec.gasRefunded)) : 0;
            (uint256 standard, uint256 floor) = _calldataGas(data);
            used = 21_000 + standard + measured;
            used -= refund < used / 5 ? refund : used / 5;
            if (21_000 + floor > used) used = 21_000 + floor;
        }
        lastTx = used;
        emit log_named_uint(string.concat("tx ", name), used);
        assertGt(used, 21_000, "measured");
    }

    /// @dev Whether forge runs each top-level call as its own transaction: a plain CALL then costs > 21000.
    ///      (A STATICCALL is not isolated, so this uses a low-level call.)
    function _isolated() internal returns (bool isolated) {
        uint256 g = gasleft();
        // Probe the factory, which no measured call touches, so no address the measurement uses gets warm
        // (with forge 1.7.1, vm.cool re-cools an account's slots but not an address already touched).
        (bool ok,) = address(factory).call(abi.encodeWithSignature("jobCount()"));
        isolated = g - gasleft() > 21_000;
        require(ok, "probe failed");
    }

    /// @dev Calldata gas (EIP-2028) and the EIP-7623 floor on calldata + execution.
    function _calldataGas(bytes memory data) internal pure returns (uint256 standard, uint256 floor) {
        uint256 zeros;
        for (uint256 i = 0; i < data.length; ++i) {
            if (data[i] == 0) ++zeros;
        }
        uint256 nonZeros = data.length - zeros;
        standard = zeros * 4 + nonZeros * 16;
        floor = (zeros + nonZeros * 4) * 10;
    }
}
