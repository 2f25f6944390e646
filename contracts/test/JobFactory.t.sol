// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Helpers} from "./Helpers.sol";
import {Clones} from "@openzeppelin/contracts/proxy/Clones.sol";
import {Initializable} from "@openzeppelin/contracts/proxy/utils/Initializable.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {JobFactory} from "../src/JobFactory.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {INodeRegistry, JobSpec} from "../src/Interfaces.sol";

/// @title JobFactoryTest
/// @notice createJob and validateSpec: every InvalidSpec field and its boundary, the slash caps at the
///         registry minimums, the timeline rule's exact boundary, the budget, and the clone initializer.
contract JobFactoryTest is Helpers {
    function setUp() public {
        _deploy();
        vm.warp(1_700_000_000);
        vm.roll(100);
    }

    function _invalid(string memory field) internal pure returns (bytes memory) {
        return abi.encodeWithSelector(JobFactory.InvalidSpec.selector, field);
    }

    /// @dev `s` is refused with `err` both by the view and by createJob, and no job is created.
    function _refused(JobSpec memory s, bytes memory err) internal {
        vm.expectRevert(err);
        factory.validateSpec(s);
        uint256 n = factory.jobCount();
        uint256 budget = 10 ether;
        vm.expectRevert(err);
        vm.prank(requester);
        factory.createJob{value: budget}(s);
        assertEq(factory.jobCount(), n, "no job created");
    }

    /// @dev `s` is accepted by the view and by createJob.
    function _accepted(JobSpec memory s) internal returns (TrainingJob job) {
        factory.validateSpec(s);
        uint256 n = factory.jobCount();
        job = _createJob(s, 10 ether);
        assertEq(factory.jobCount(), n + 1, "job created");
        assertTrue(factory.isJob(address(job)), "registered");
    }

    // ------------------------------------------------------------------ createJob

    function test_createJob_escrowsBudgetAndRegistersClone() public {
        JobSpec memory s = _spec();
        uint256 budget = 5 ether;
        uint256 before = requester.balance;
        TrainingJob job = _createJob(s, budget);
        assertTrue(factory.isJob(address(job)), "isJob");
        assertEq(factory.jobCount(), 1, "jobCount");
        assertEq(factory.jobs(0), address(job), "jobs[0]");
        assertEq(job.escrow(), budget, "escrow");
        assertEq(address(job).balance, budget, "balance");
        assertEq(requester.balance, before - budget, "paid by the requester");
        assertEq(job.requester(), requester, "requester");
        assertEq(address(job.registry()), address(registry), "registry");
        assertEq(job.policyRoot(0), s.modelHash, "version 0 is the base model");
        assertEq(uint256(job.currentVersion()), 0, "clock at 0");
        assertEq(job.leaseCost(), _cost(s), "leaseCost");
        assertEq(keccak256(abi.encode(job.spec())), keccak256(abi.encode(s)), "spec stored verbatim");
        assertFalse(factory.isJob(address(implementation)), "template is not a job");
        assertFalse(factory.isJob(outsider), "random address is not a job");
        TrainingJob job2 = _createJob(s, budget);
        assertEq(factory.jobs(1), address(job2), "creation order");
        assertNotEq(uint256(uint160(address(job))), uint256(uint160(address(job2))), "distinct clones");
        _assertJobSolvent(job);
    }

    function test_createJob_emitsEvents() public {
        JobSpec memory s = _spec();
        vm.expectEmit(false, true, true, true, address(factory));
        emit JobFactory.JobCreated(address(0), requester, trainer, 2 ether);
        _createJob(s, 2 ether);
    }

    function test_defaultSpec_isValid() public {
        _accepted(_spec());
        assertEq(factory.timeline(_spec()), 1 hours + 3 hours + 2 days + 1 days, "fixture timeline");
    }

    // ------------------------------------------------------------------ each field

    /// @notice The recipe is stored whole and read back field by field: every role reads it from here.
    function test_createJob_storesTheWholeRecipe() public {
        JobSpec memory s = _spec();
        s.modelName = "smollm2";
        s.taskName = "gym:basic_arithmetic";
        s.maxNewTokens = 256;
        s.temperatureMilli = 700;
        s.chatTemplate = true;
        s.stopOnEos = false;
        JobSpec memory stored = _accepted(s).spec();
        assertEq(bytes(stored.modelName), bytes("smollm2"), "model name");
        assertEq(bytes(stored.taskName), bytes("gym:basic_arithmetic"), "task name");
        assertEq(stored.taskConfigHash, s.taskConfigHash, "task configuration");
        assertEq(uint256(stored.maxNewTokens), 256, "max new tokens");
        assertEq(uint256(stored.temperatureMilli), 700, "temperature");
        assertTrue(stored.chatTemplate, "chat template");
        assertFalse(stored.stopOnEos, "stop on EOS");
        assertEq(stored.modelHash, s.modelHash, "model root");
        assertEq(stored.modelFilesHash, s.modelFilesHash, "model files");
    }

    function test_validateSpec_recipe() public {
        JobSpec memory s = _spec();
        s.modelHash = bytes32(0);
        _refused(s, _invalid("modelHash"));
        s = _spec();
        s.taskConfigHash = bytes32(0);
        _refused(s, _invalid("taskConfigHash"));
        s = _spec();
        s.modelFilesHash = bytes32(0);
        _refused(s, _invalid("modelFilesHash"));
        s = _spec();
        s.modelName = "";
        _refused(s, _invalid("modelName"));
        s.modelName = string(new bytes(257));
        _refused(s, _invalid("modelName"));
        s = _spec();
        s.taskName = "";
        _refused(s, _invalid("taskName"));
        s.taskName = string(new bytes(256)); // 256 NUL bytes: not text
        _refused(s, _invalid("taskName"));
        s.taskName = "gym:basic\x1b[2J";
        _refused(s, _invalid("taskName"));
        s.modelName = string(abi.encodePacked("emb", hex"ff", "edded"));
        s.taskName = "gym:basic_arithmetic";
        _refused(s, _invalid("modelName"));
        s = _spec();
        bytes memory longest = new bytes(256);
        for (uint256 i = 0; i < longest.length; ++i) {
            longest[i] = "a";
        }
        s.taskName = string(longest);
        _accepted(s);
        s.taskName = string(abi.encodePacked(longest, "a"));
        _refused(s, _invalid("taskName"));
        s = _spec();
        s.maxNewTokens = 0;
        _refused(s, _invalid("maxNewTokens"));
        s.maxNewTokens = 4097;
        _refused(s, _invalid("maxNewTokens"));
        s.maxNewTokens = 4096;
        _accepted(s);
        s = _spec();
        s.temperatureMilli = 99;
        _refused(s, _invalid("temperatureMilli"));
        s.temperatureMilli = 100;
        _accepted(s);
        s.temperatureMilli = 5001;
        _refused(s, _invalid("temperatureMilli"));
        s.temperatureMilli = 5000;
        _accepted(s);
    }

    function test_validateSpec_trainer() public {
        JobSpec memory s = _spec();
        s.trainer = address(0);
        _refused(s, _invalid("trainer"));
    }

    function test_validateSpec_groupSizeAndTasksPerLease() public {
        JobSpec memory s = _spec();
        s.groupSize = 0;
        _refused(s, _invalid("groupSize"));
        s = _spec();
        s.tasksPerLease = 0;
        _refused(s, _invalid("tasksPerLease"));
        s = _spec();
        s.groupSize = 1;
        s.tasksPerLease = 1;
        s.samplesChecked = 1;
        _accepted(s);
    }

    function test_validateSpec_committeeSizeBounds() public {
        JobSpec memory s = _spec();
        s.committeeSize = 0;
        _refused(s, _invalid("committeeSize"));
        s.committeeSize = factory.MAX_COMMITTEE() + 1;
        _refused(s, _invalid("committeeSize"));
        s.committeeSize = factory.MAX_COMMITTEE();
        _accepted(s);
        s.committeeSize = 1;
        _accepted(s);
    }

    function test_validateSpec_appealRoundsBounds() public {
        JobSpec memory s = _spec();
        s.appealRounds = 0;
        _refused(s, _invalid("appealRounds"));
        s.appealRounds = factory.MAX_APPEAL_ROUNDS() + 1;
        _refused(s, _invalid("appealRounds"));
        s.appealRounds = factory.MAX_APPEAL_ROUNDS();
        s.appealWindow = 1 days; // 1h + 4h + 3d + 1d < 7d
        _accepted(s);
        s.appealRounds = 1;
        _accepted(s);
    }

    function test_validateSpec_clipParameters() public {
        JobSpec memory s = _spec();
        s.clipEpsilonMilli = 0;
        _refused(s, _invalid("clipEpsilonMilli"));
        s.clipEpsilonMilli = 1000;
        _refused(s, _invalid("clipEpsilonMilli"));
        s.clipEpsilonMilli = 999;
        _accepted(s);
        s = _spec();
        s.clipDeltaMilli = 1000;
        _refused(s, _invalid("clipDeltaMilli"));
        s.clipDeltaMilli = 0;
        _refused(s, _invalid("clipDeltaMilli"));
        s.clipDeltaMilli = 1001;
        _accepted(s);
    }

    function test_validateSpec_windows() public {
        JobSpec memory s = _spec();
        s.leaseDuration = 0;
        _refused(s, _invalid("leaseDuration"));
        s = _spec();
        s.voteWindow = 0;
        _refused(s, _invalid("voteWindow"));
        s = _spec();
        s.appealWindow = 0;
        _refused(s, _invalid("appealWindow"));
        s = _spec();
        s.leaseDuration = 1;
        s.voteWindow = factory.MIN_WINDOW();
        s.appealWindow = factory.MIN_WINDOW();
        _accepted(s); // the shortest lease and the shortest windows
    }

    /// @notice Vote and appeal windows are at least MIN_WINDOW (60 s): at the bound accepted, one second
    ///         under refused, each window on its own.
    function test_validateSpec_minWindowBoundary() public {
        uint64 m = factory.MIN_WINDOW();
        assertEq(uint256(m), 60, "MIN_WINDOW");
        JobSpec memory s = _spec();
        s.voteWindow = m - 1;
        _refused(s, _invalid("voteWindow"));
        s.voteWindow = m;
        _accepted(s);
        s = _spec();
        s.appealWindow = m - 1;
        _refused(s, _invalid("appealWindow"));
        s.appealWindow = m;
        _accepted(s);
        // Both too short: the vote window is reported first.
        s.voteWindow = m - 1;
        s.appealWindow = m - 1;
        _refused(s, _invalid("voteWindow"));
    }

    function testFuzz_validateSpec_windowsBelowMinimumRefused(uint64 vote, uint64 appealW) public {
        uint64 m = factory.MIN_WINDOW();
        vote = uint64(bound(vote, 0, 2 * m));
        appealW = uint64(bound(appealW, 0, 2 * m));
        JobSpec memory s = _spec();
        s.voteWindow = vote;
        s.appealWindow = appealW;
        if (vote < m) _refused(s, _invalid("voteWindow"));
        else if (appealW < m) _refused(s, _invalid("appealWindow"));
        else _accepted(s);
    }

    function test_validateSpec_rewardPerSample() public {
        JobSpec memory s = _spec();
        s.rewardPerSample = 0;
        _refused(s, _invalid("rewardPerSample"));
    }

    function test_validateSpec_slashAmountCappedAtWorkerMinimum() public {
        JobSpec memory s = _spec();
        s.slashAmount = 0;
        _refused(s, _invalid("slashAmount"));
        s.slashAmount = MIN_WORKER + 1;
        s.expiryFee = 1;
        _refused(s, _invalid("slashAmount"));
        s.slashAmount = 1000 ether;
        _refused(s, _invalid("slashAmount"));
        s.slashAmount = MIN_WORKER;
        _accepted(s);
    }

    function test_validateSpec_expiryFeeAtMostSlash() public {
        JobSpec memory s = _spec();
        s.expiryFee = 0;
        _refused(s, _invalid("expiryFee"));
        s.expiryFee = s.slashAmount + 1;
        _refused(s, _invalid("expiryFee"));
        s.expiryFee = s.slashAmount;
        _accepted(s);
    }

    function test_validateSpec_voterSlashCappedAtValidatorMinimum() public {
        JobSpec memory s = _spec();
        s.voterSlash = 0;
        _refused(s, _invalid("voterSlash"));
        s.voterSlash = MIN_VALIDATOR + 1;
        _refused(s, _invalid("voterSlash"));
        s.voterSlash = MIN_VALIDATOR;
        _accepted(s);
    }

    /// @notice 0 < absentPenalty <= voterSlash / ABSENT_PENALTY_DIVISOR (10), rounded down: at the cap
    ///         accepted, one wei over refused.
    function test_validateSpec_absentPenaltyAtMostATenthOfVoterSlash() public {
        uint256 d = factory.ABSENT_PENALTY_DIVISOR();
        assertEq(d, 10, "ABSENT_PENALTY_DIVISOR");
        JobSpec memory s = _spec();
        s.absentPenalty = 0;
        _refused(s, _invalid("absentPenalty"));
        s.absentPenalty = s.voterSlash / d + 1;
        _refused(s, _invalid("absentPenalty"));
        s.absentPenalty = s.voterSlash; // allowed before: now far over the cap
        _refused(s, _invalid("absentPenalty"));
        s.absentPenalty = s.voterSlash / d;
        _accepted(s);
        // The largest voter slash: the cap scales with it.
        s.voterSlash = MIN_VALIDATOR;
        s.absentPenalty = MIN_VALIDATOR / d + 1;
        _refused(s, _invalid("absentPenalty"));
        s.absentPenalty = MIN_VALIDATOR / d;
        _accepted(s);
        // A voter slash not divisible by 10: the cap is rounded down.
        s.voterSlash = 1 ether + 9;
        s.absentPenalty = 0.1 ether + 1;
        _refused(s, _invalid("absentPenalty"));
        s.absentPenalty = 0.1 ether;
        _accepted(s);
        // Tiny voter slashes: 10 wei allows 1 wei; under 10 wei no absent penalty is valid.
        s.voterSlash = 10;
        s.absentPenalty = 1;
        _accepted(s);
        s.absentPenalty = 2;
        _refused(s, _invalid("absentPenalty"));
        s.voterSlash = 9;
        s.absentPenalty = 1;
        _refused(s, _invalid("absentPenalty"));
    }

    function test_validateSpec_appealBondPositiveAndBounded() public {
        JobSpec memory s = _spec();
        s.appealBond = 0;
        _refused(s, _invalid("appealBond"));
        s.appealBond = uint256(type(uint128).max) + 1;
        _refused(s, _invalid("appealBond"));
        s.appealBond = type(uint128).max;
        _accepted(s);
    }

    /// @notice The checks run in field order: the first invalid field is the one reported.
    function test_validateSpec_reportsFirstInvalidField() public {
        JobSpec memory s = _spec();
        s.groupSize = 0;
        s.appealBond = 0;
        s.slashAmount = 0;
        _refused(s, _invalid("groupSize"));
        s.groupSize = 4;
        _refused(s, _invalid("slashAmount"));
    }

    function testFuzz_validateSpec_slashCaps(uint256 slash, uint256 fee, uint256 voterSlash, uint256 absent) public {
        slash = bound(slash, 0, 3 * MIN_WORKER);
        fee = bound(fee, 0, 3 * MIN_WORKER);
        voterSlash = bound(voterSlash, 0, 3 * MIN_VALIDATOR);
        // Mostly around the cap (voterSlash / 10), sometimes anywhere up to three validator minimums.
        absent = absent % 4 == 0 ? bound(absent, 0, 3 * MIN_VALIDATOR) : bound(absent, 0, MIN_VALIDATOR / 5);
        JobSpec memory s = _spec();
        s.slashAmount = slash;
        s.expiryFee = fee;
        s.voterSlash = voterSlash;
        s.absentPenalty = absent;
        bytes memory err;
        if (slash == 0 || slash > MIN_WORKER) err = _invalid("slashAmount");
        else if (fee == 0 || fee > slash) err = _invalid("expiryFee");
        else if (voterSlash == 0 || voterSlash > MIN_VALIDATOR) err = _invalid("voterSlash");
        else if (absent == 0 || absent > voterSlash / 10) err = _invalid("absentPenalty");
        else err = _deterrenceError(s);
        if (err.length > 0) {
            _refused(s, err);
        } else {
            TrainingJob job = _accepted(s);
            assertLe(job.spec().slashAmount, registry.minWorkerStake(), "worker slash capped");
            assertLe(job.spec().voterSlash, registry.minValidatorStake(), "voter slash capped");
            assertLe(job.spec().absentPenalty * 10, job.spec().voterSlash, "absent penalty at most a tenth");
        }
    }

    // ------------------------------------------------------------------ sampled verification

    /// @dev The sizing rule's refusal of `s` (empty if it deters every cheat): the end it checks first that fails.
    function _deterrenceError(JobSpec memory s) internal view returns (bytes memory) {
        uint256[2] memory ends = [uint256(s.minCheatPpm), uint256(factory.PPM())];
        for (uint256 i = 0; i < 2; ++i) {
            (uint256 expected, uint256 gain) = factory.deterrence(s, ends[i]);
            if (expected <= gain) {
                return abi.encodeWithSelector(JobFactory.CheatNotDeterred.selector, ends[i], expected / 1e18, gain / 1e18);
            }
        }
        return "";
    }

    function test_validateSpec_samplesCheckedWithinTheLease() public {
        JobSpec memory s = _spec(); // 4 x 2 = 8 rollouts a lease
        s.samplesChecked = 0;
        _refused(s, _invalid("samplesChecked"));
        s.samplesChecked = 9;
        _refused(s, _invalid("samplesChecked"));
        s.samplesChecked = 8;
        _accepted(s);
    }

    function test_validateSpec_minCheatPpmIsAFraction() public {
        JobSpec memory s = _spec();
        s.minCheatPpm = 0;
        _refused(s, _invalid("minCheatPpm"));
        s.minCheatPpm = 1_000_001;
        _refused(s, _invalid("minCheatPpm"));
        s.minCheatPpm = 1_000_000;
        _accepted(s);
    }

    /// @notice (1 - c)^draws in WAD, exactly where it is representable, and 1 with no draws.
    function test_missChance_values() public view {
        assertEq(factory.missChance(500_000, 1), 0.5e18, "1/2");
        assertEq(factory.missChance(500_000, 3), 0.125e18, "1/8");
        assertEq(factory.missChance(15_625, 1), 0.984375e18, "63/64");
        assertEq(factory.missChance(15_625, 2), 0.968994140625e18, "(63/64)^2");
        assertEq(factory.missChance(1_000_000, 1), 0, "c = 1 always caught");
        assertEq(factory.missChance(0, 1000), 1e18, "no cheat, never caught");
        assertEq(factory.missChance(300_000, 0), 1e18, "no draws, never caught");
        // 1/3 is not representable: the miss chance rounds up (in the cheater's favour, so against the spec).
        assertGe(factory.missChance(666_667, 2), (333_333e12 * uint256(333_333e12)) / 1e18, "rounded up");
    }

    /// @notice At c = 1 the rule is slash > the lease's pay: equal is refused, one wei more accepted.
    function test_sizingRule_wholeBatchBoundary() public {
        JobSpec memory s = _spec();
        s.minCheatPpm = 1_000_000;
        s.expiryFee = 1;
        uint256 pay = _cost(s);
        s.slashAmount = pay;
        _refused(s, abi.encodeWithSelector(JobFactory.CheatNotDeterred.selector, 1_000_000, pay, pay));
        s.slashAmount = pay + 1;
        _accepted(s);
    }

    /// @notice One faked rollout of 64, one member checking one rollout: caught with chance 1/64, so the slash
    ///         must exceed 64 rollouts' pay; the refusal names the smallest fraction, the end that binds.
    function test_sizingRule_smallestCheatBoundary() public {
        JobSpec memory s = _spec();
        s.groupSize = 8;
        s.tasksPerLease = 8;
        s.committeeSize = 1;
        s.samplesChecked = 1;
        s.minCheatPpm = 15_625; // 1/64
        s.expiryFee = 1;
        s.slashAmount = 64 * s.rewardPerSample;
        _refused(s, abi.encodeWithSelector(JobFactory.CheatNotDeterred.selector, 15_625, s.rewardPerSample,
            s.rewardPerSample));
        s.slashAmount = 64 * s.rewardPerSample + 64;
        _accepted(s);
        // P(c) >= c for every c once a single rollout is drawn, so a slash above the lease's pay deters every
        // fraction: the smallest one, with more draws, never needs more.
        s.committeeSize = 5;
        s.samplesChecked = 3;
        s.slashAmount = 64 * s.rewardPerSample + 1;
        _accepted(s);
    }

    /// @notice A cheater's view of an accepted spec: at every fraction from the smallest it names to all of
    ///         the batch, its expected slash exceeds its gain (the two ends checked cover the rest: concave),
    ///         up to the rule's round-up of miss chances (a few 1e-18 of the slash).
    function testFuzz_sizingRule_everyFractionDeterred(uint32 minCheat, uint32 cheat, uint32 samples, uint32 q,
        uint256 slash) public {
        JobSpec memory s = _spec();
        s.groupSize = 8;
        s.tasksPerLease = 8;
        s.minCheatPpm = uint32(bound(minCheat, 1, 1_000_000));
        s.samplesChecked = uint32(bound(samples, 1, 64));
        s.committeeSize = uint32(bound(q, 1, 64));
        s.slashAmount = bound(slash, 1, MIN_WORKER);
        s.expiryFee = 1;
        if (_deterrenceError(s).length > 0) return;
        _accepted(s);
        uint256 c = bound(cheat, s.minCheatPpm, 1_000_000);
        (uint256 expected, uint256 gain) = factory.deterrence(s, c);
        uint256 draws = uint256(s.samplesChecked) * s.committeeSize;
        assertGt(expected + 4 * draws * s.slashAmount, gain, "cheating at this fraction does not pay");
    }

    // ------------------------------------------------------------------ timeline

    function test_timeline_formula() public view {
        JobSpec memory s = _spec();
        s.leaseDuration = 11;
        s.voteWindow = 7;
        s.appealWindow = 5;
        s.appealRounds = 3;
        assertEq(
            factory.timeline(s),
            11 + 4 * 7 + 3 * 5 + factory.KEEPER_MARGIN(),
            "lease + rounds*vote + appeals*appeal + margin"
        );
        s.appealRounds = 1;
        assertEq(factory.timeline(s), 11 + 2 * 7 + 5 + 1 days, "one appeal");
        assertEq(uint256(factory.KEEPER_MARGIN()), 1 days, "margin");
    }

    function test_timeline_exactBoundary() public {
        JobSpec memory s = _spec();
        uint256 rest = factory.timeline(s) - s.leaseDuration;
        // timeline == unbonding: refused.
        s.leaseDuration = uint64(UNBONDING - rest);
        assertEq(factory.timeline(s), UNBONDING, "at the period");
        _refused(s, abi.encodeWithSelector(JobFactory.TimelineTooLong.selector, uint256(UNBONDING), UNBONDING));
        // timeline == unbonding - 1: accepted.
        s.leaseDuration = uint64(UNBONDING - rest - 1);
        assertEq(factory.timeline(s), UNBONDING - 1, "one second under");
        _accepted(s);
        // The same boundary on the appeal window.
        s = _spec();
        s.appealRounds = 1;
        rest = factory.timeline(s) - s.appealWindow;
        s.appealWindow = uint64(UNBONDING - rest);
        _refused(s, abi.encodeWithSelector(JobFactory.TimelineTooLong.selector, uint256(UNBONDING), UNBONDING));
        s.appealWindow -= 1;
        _accepted(s);
    }

    function test_timeline_hugeWindowsDoNotOverflow() public {
        JobSpec memory s = _spec();
        s.leaseDuration = type(uint64).max;
        s.voteWindow = type(uint64).max;
        s.appealWindow = type(uint64).max;
        s.appealRounds = 3;
        uint256 t = factory.timeline(s);
        assertEq(t, uint256(type(uint64).max) * 8 + 1 days, "computed in 256 bits");
        _refused(s, abi.encodeWithSelector(JobFactory.TimelineTooLong.selector, t, UNBONDING));
    }

    function testFuzz_timeline_boundEnforced(uint64 lease, uint64 vote, uint64 appealW, uint32 rounds) public {
        lease = uint64(bound(lease, 1, 8 days));
        vote = uint64(bound(vote, factory.MIN_WINDOW(), 3 days));
        appealW = uint64(bound(appealW, factory.MIN_WINDOW(), 3 days));
        rounds = uint32(bound(rounds, 1, 3));
        JobSpec memory s = _spec();
        s.leaseDuration = lease;
        s.voteWindow = vote;
        s.appealWindow = appealW;
        s.appealRounds = rounds;
        uint256 t = uint256(lease) + (uint256(rounds) + 1) * vote + uint256(rounds) * appealW + 1 days;
        assertEq(factory.timeline(s), t, "formula");
        if (t >= UNBONDING) {
            _refused(s, abi.encodeWithSelector(JobFactory.TimelineTooLong.selector, t, UNBONDING));
        } else {
            TrainingJob job = _accepted(s);
            assertLt(factory.timeline(job.spec()), registry.unbondingPeriod(), "every job obeys the rule");
        }
    }

    // ------------------------------------------------------------------ budget

    function test_createJob_budgetAtLeastOneLease() public {
        JobSpec memory s = _spec();
        uint256 cost = _cost(s);
        vm.expectRevert(abi.encodeWithSelector(JobFactory.BudgetTooSmall.selector, cost - 1, cost));
        vm.prank(requester);
        factory.createJob{value: cost - 1}(s);
        vm.expectRevert(abi.encodeWithSelector(JobFactory.BudgetTooSmall.selector, 0, cost));
        vm.prank(requester);
        factory.createJob(s);
        assertEq(factory.jobCount(), 0, "none created");
        TrainingJob job = _createJob(s, cost);
        assertEq(job.escrow(), cost, "exactly one lease");
    }

    /// @notice validateSpec, the client's pre-flight check, refuses a spec whose lease cost
    ///         (rewardPerSample * groupSize * tasksPerLease) would overflow, so createJob fails with
    ///         InvalidSpec instead of an arithmetic panic (found by review).
    function test_validateSpec_refusesAnOverflowingLeaseCost() public {
        JobSpec memory s = _spec();
        s.rewardPerSample = type(uint256).max / 4; // x groupSize 4 x tasksPerLease 2 overflows
        (bool viewOk,) = address(factory).staticcall(abi.encodeCall(JobFactory.validateSpec, (s)));
        vm.prank(requester);
        (bool ok, bytes memory ret) = address(factory).call{value: 1 ether}(abi.encodeCall(JobFactory.createJob, (s)));
        assertFalse(ok, "createJob cannot create it");
        assertFalse(viewOk, "validateSpec accepts a spec that createJob cannot create");
        assertEq(
            bytes4(ret), JobFactory.InvalidSpec.selector, "createJob should refuse it with InvalidSpec, not a panic"
        );
    }

    // ------------------------------------------------------------------ initializer

    function test_implementation_isLocked() public {
        JobSpec memory s = _spec();
        vm.expectRevert(Initializable.InvalidInitialization.selector);
        vm.prank(address(factory));
        implementation.initialize(s, requester, INodeRegistry(address(registry)));
        assertEq(implementation.requester(), address(0), "template uninitialised");
    }

    function test_clone_cannotBeReinitialized() public {
        JobSpec memory s = _spec();
        TrainingJob job = _createJob(s, 1 ether);
        vm.expectRevert(Initializable.InvalidInitialization.selector);
        vm.prank(address(factory));
        job.initialize(s, outsider, INodeRegistry(address(registry)));
        vm.expectRevert(Initializable.InvalidInitialization.selector);
        vm.prank(outsider);
        job.initialize(s, outsider, INodeRegistry(address(registry)));
        assertEq(job.requester(), requester, "requester unchanged");
    }

    function test_clone_onlyTheFactoryInitializes() public {
        JobSpec memory s = _spec();
        TrainingJob raw = TrainingJob(payable(Clones.clone(address(implementation))));
        vm.expectRevert(TrainingJob.NotFactory.selector);
        vm.prank(outsider);
        raw.initialize(s, outsider, INodeRegistry(address(registry)));
        // A clone the factory did not create is no job, even once initialised: it cannot lock or slash.
        vm.deal(address(factory), 1 ether);
        vm.prank(address(factory));
        raw.initialize{value: 1 ether}(s, requester, INodeRegistry(address(registry)));
        assertEq(raw.escrow(), 1 ether, "funded");
        assertFalse(factory.isJob(address(raw)), "not a factory job");
        _join(worker, WORKER, 2 ether);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, address(raw)));
        vm.prank(worker);
        raw.claim();
        assertEq(_locked(worker), 0, "nothing locked");
    }

    function test_rogueFactory_cannotCreateJobsForTheRegistry() public {
        JobFactory rogue = new JobFactory(INodeRegistry(address(registry)), address(implementation));
        JobSpec memory s = _spec();
        vm.expectRevert(TrainingJob.NotFactory.selector);
        vm.prank(requester);
        rogue.createJob{value: 1 ether}(s);
        assertEq(rogue.jobCount(), 0, "rolled back");
    }
}
