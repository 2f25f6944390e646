// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Fixture} from "./Fixture.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {JobSpec} from "../src/Interfaces.sol";

/// @title GasPathTest
/// @notice Gas of one worker lease on the happy path with realistic parameters (8 completions x 8 tasks,
///         quorum 2): claim, submit, attest x2, finalize, withdrawPayment, and the cost per accepted sample.
/// @dev Each call is measured in steady state (a previous lease already touched the job's counters) with the
///      job's and registry's storage cooled first, so SLOADs are priced as in a fresh transaction. `execution`
///      is the gas the call itself used; `tx` adds the 21000 intrinsic gas and the calldata gas (EIP-2028,
///      with the EIP-7623 floor) and ignores refunds. Run `script/gas_report.sh` for the table and forge's
///      own per-function report.
contract GasPathTest is Fixture {
    uint32 internal constant GROUP = 8;
    uint32 internal constant TASKS = 8;

    TrainingJob internal job;
    JobSpec internal s;

    uint256 public gasClaim;
    uint256 public gasSubmit;
    uint256 public gasAttestFirst;
    uint256 public gasAttestQuorum;
    uint256 public gasFinalize;
    uint256 public gasWithdrawPayment;
    uint256 public txClaim;
    uint256 public txSubmit;
    uint256 public txAttestFirst;
    uint256 public txAttestQuorum;
    uint256 public txFinalize;
    uint256 public txWithdrawPayment;

    function setUp() public {
        _deploy();
        vm.warp(1_700_000_000);
        vm.roll(1000);
        _join(worker, WORKER, 2 ether);
        _join(worker2, WORKER, 2 ether);
        _join(v1, VALIDATOR, 4 ether);
        _join(v2, VALIDATOR, 4 ether);
        _join(v3, VALIDATOR, 4 ether);
        s = _spec();
        s.groupSize = GROUP;
        s.tasksPerLease = TASKS;
        s.quorum = 2;
        s.rewardPerSample = 0.0001 ether;
        job = _createJob(s, 10 ether);
        vm.prank(trainer);
        job.publishPolicy(1, keccak256("v1"));
        // Warm-up lease by another worker so counters (nextTask, leaseCount, reserved, totalOwed) are non-zero,
        // as on a job that has been running for a while.
        uint256 w = _claim(job, worker2);
        _submit(job, worker2, w, 1);
        _attest(job, v1, w, true);
        _attest(job, v2, w, true);
        vm.warp(uint256(_deadline(job, w)) + 1);
        job.finalize(w);
        _claim(job, worker2); // leave one lease open: `reserved` stays non-zero
    }

    function test_gasPath_oneAcceptedLease() public {
        uint256 id = job.leaseCount() + 1;
        bytes32 root = keccak256("merkle root of 64 rollouts");

        (gasClaim, txClaim) = _measure(worker, abi.encodeCall(TrainingJob.claim, ()));
        assertEq(job.getLease(id).worker, worker, "claimed");

        (gasSubmit, txSubmit) = _measure(worker, abi.encodeCall(TrainingJob.submit, (id, root, 1)));
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Submitted), "submitted");

        (gasAttestFirst, txAttestFirst) = _measure(v1, abi.encodeCall(TrainingJob.attest, (id, true)));
        (gasAttestQuorum, txAttestQuorum) = _measure(v2, abi.encodeCall(TrainingJob.attest, (id, true)));
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Accepted), "accepted at quorum");

        vm.warp(uint256(_deadline(job, id)) + 1);
        (gasFinalize, txFinalize) = _measure(outsider, abi.encodeCall(TrainingJob.finalize, (id)));
        uint256 pay = job.leaseCost();
        assertEq(job.owed(worker), pay, "credited");

        uint256 before = worker.balance;
        (gasWithdrawPayment, txWithdrawPayment) = _measure(worker, abi.encodeCall(TrainingJob.withdrawPayment, ()));
        assertEq(worker.balance, before + pay, "paid");

        uint256 samples = uint256(GROUP) * TASKS;
        uint256 execTotal = gasClaim + gasSubmit + gasAttestFirst + gasAttestQuorum + gasFinalize + gasWithdrawPayment;
        uint256 txTotal = txClaim + txSubmit + txAttestFirst + txAttestQuorum + txFinalize + txWithdrawPayment;

        emit log_named_uint("exec claim", gasClaim);
        emit log_named_uint("exec submit", gasSubmit);
        emit log_named_uint("exec attest (1st vote)", gasAttestFirst);
        emit log_named_uint("exec attest (quorum vote)", gasAttestQuorum);
        emit log_named_uint("exec finalize", gasFinalize);
        emit log_named_uint("exec withdrawPayment", gasWithdrawPayment);
        emit log_named_uint("exec total per lease", execTotal);
        emit log_named_uint("exec per accepted sample", execTotal / samples);
        emit log_named_uint("tx claim", txClaim);
        emit log_named_uint("tx submit", txSubmit);
        emit log_named_uint("tx attest (1st vote)", txAttestFirst);
        emit log_named_uint("tx attest (quorum vote)", txAttestQuorum);
        emit log_named_uint("tx finalize", txFinalize);
        emit log_named_uint("tx withdrawPayment", txWithdrawPayment);
        emit log_named_uint("tx total per lease", txTotal);
        emit log_named_uint("tx per accepted sample", txTotal / samples);
        emit log_named_uint("samples per lease", samples);

        // Guard rails: a regression that makes the path much dearer fails here.
        assertLt(txTotal, 400_000, "one lease's path stays under 400k gas");
        assertLt(txTotal / samples, 6_000, "under 6k gas per accepted sample");
        assertGt(gasClaim, 0, "measured");
    }

    /// @notice Validators amortise votes with attestBatch: gas per vote when one validator votes on 8 leases.
    function test_gasPath_attestBatchOfEight() public {
        uint256 n = 8;
        uint256[] memory ids = new uint256[](n);
        bool[] memory acc = new bool[](n);
        for (uint256 i = 0; i < n; ++i) {
            uint256 id = _claim(job, i % 2 == 0 ? worker : worker2);
            _submit(job, i % 2 == 0 ? worker : worker2, id, 1);
            ids[i] = id;
            acc[i] = true;
        }
        (uint256 exec, uint256 txg) = _measure(v1, abi.encodeCall(TrainingJob.attestBatch, (ids, acc)));
        (uint256 exec2, uint256 txg2) = _measure(v2, abi.encodeCall(TrainingJob.attestBatch, (ids, acc)));
        for (uint256 i = 0; i < n; ++i) {
            assertEq(uint256(_status(job, ids[i])), uint256(TrainingJob.Status.Accepted), "all decided");
        }
        emit log_named_uint("exec attestBatch(8), 1st votes", exec);
        emit log_named_uint("exec attestBatch(8), quorum votes", exec2);
        emit log_named_uint("tx attestBatch(8), 1st votes, per lease", txg / n);
        emit log_named_uint("tx attestBatch(8), quorum votes, per lease", txg2 / n);
        assertLt(txg2 / n, 40_000, "batched quorum vote under 40k per lease");
    }

    // ------------------------------------------------------------------ measuring

    /// @dev Run `data` on the job as `who` with cold job/registry storage; return execution gas and an estimate
    ///      of the whole transaction's gas (intrinsic + calldata + execution, no refunds).
    function _measure(address who, bytes memory data) internal returns (uint256 exec, uint256 txGas) {
        vm.cool(address(job));
        vm.cool(address(registry));
        vm.cool(address(implementation));
        vm.cool(address(factory));
        // A transaction's target and sender are warm from the start; re-warm the addresses (not their slots).
        uint256 warm = address(job).balance + who.balance;
        warm;
        vm.prank(who);
        uint256 g = gasleft();
        (bool ok,) = address(job).call(data);
        exec = g - gasleft();
        require(ok, "measured call reverted");
        (uint256 standard, uint256 floor) = _calldataGas(data);
        txGas = 21_000 + (standard + exec > floor ? standard + exec : floor);
    }

    /// @dev Calldata gas (EIP-2028) and the EIP-7623 floor the execution + calldata part may not go below.
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
