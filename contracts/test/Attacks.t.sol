// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Helpers, Puppet, SeedPeeker} from "./Helpers.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {JobFactory} from "../src/JobFactory.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {JobSpec} from "../src/Interfaces.sol";

/// @notice Shared setting of the attack suites: a fresh deployment at a fixed time and height.
abstract contract AttackBase is Helpers {
    uint256 internal constant T0 = 1_700_000_000;
    uint256 internal constant BUDGET = 1 ether;

    function _start() internal {
        _deploy();
        vm.warp(T0);
        vm.roll(100);
    }

    /// @notice What `who` holds before any job exists (wallet and stake).
    function _holdings(address who) internal view returns (uint256) {
        (,, uint256 active, uint256 locked, uint256 unbonding,) = registry.nodeInfo(who);
        return who.balance + active + locked + unbonding;
    }

    function _solvent(TrainingJob job) internal view {
        _assertJobSolvent(job);
        _assertRegistrySolvent();
    }

    function _invalid(string memory field) internal pure returns (bytes memory) {
        return abi.encodeWithSelector(JobFactory.InvalidSpec.selector, field);
    }

    function _exec(address puppet, address target, uint256 value, bytes memory data) internal {
        Puppet(payable(puppet)).exec(target, value, data);
    }
}

// ======================================================================================================
// (1) A requester takes everyone's stake: a huge slash, its own votes and appeals, and the refund.
// ======================================================================================================

/// @title Attack1_RequesterTakesStakeTest
/// @notice The old requester/arbiter power is gone: slashes are capped by the factory, a requester with a
///         minimum validator stake is outvoted in every round, loses its bonds and its stake, the honest
///         worker is paid and keeps its stake, honest validators lose nothing, and `close` refunds only
///         unreserved escrow, never slashed value.
contract Attack1_RequesterTakesStakeTest is AttackBase {
    uint256 internal constant HONEST = 4 ether;
    JobSpec internal s;

    function setUp() public {
        _start();
        _join(worker, WORKER, 5 ether);
        _join(worker2, WORKER, 5 ether);
        _join(v1, VALIDATOR, HONEST);
        _join(v2, VALIDATOR, HONEST);
        _join(v3, VALIDATOR, HONEST);
        _join(requester, VALIDATOR, MIN_VALIDATOR); // W = 14; committee 8: 8 * 2 >= 14, everyone sits
        _roll(1);
        s = _spec();
        s.committeeSize = 8;
    }

    function test_hugeSlashSpecsRefusedByTheFactory() public {
        JobSpec memory evil = _spec();
        evil.slashAmount = 100 ether;
        vm.expectRevert(_invalid("slashAmount"));
        vm.prank(requester);
        factory.createJob{value: BUDGET}(evil);
        evil = _spec();
        evil.voterSlash = 100 ether;
        vm.expectRevert(_invalid("voterSlash"));
        vm.prank(requester);
        factory.createJob{value: BUDGET}(evil);
        evil = _spec();
        evil.absentPenalty = evil.voterSlash + 1;
        vm.expectRevert(_invalid("absentPenalty"));
        vm.prank(requester);
        factory.createJob{value: BUDGET}(evil);
        evil.absentPenalty = evil.voterSlash / factory.ABSENT_PENALTY_DIVISOR() + 1;
        vm.expectRevert(_invalid("absentPenalty"));
        vm.prank(requester);
        factory.createJob{value: BUDGET}(evil);
        evil = _spec();
        evil.expiryFee = evil.slashAmount + 1;
        vm.expectRevert(_invalid("expiryFee"));
        vm.prank(requester);
        factory.createJob{value: BUDGET}(evil);
        // The harshest accepted job takes at most one minimum stake per lease from anyone.
        evil = _spec();
        evil.slashAmount = MIN_WORKER;
        evil.expiryFee = MIN_WORKER;
        evil.voterSlash = MIN_VALIDATOR;
        evil.absentPenalty = MIN_VALIDATOR / factory.ABSENT_PENALTY_DIVISOR();
        TrainingJob job = _createJob(evil, BUDGET);
        assertEq(job.spec().slashAmount, registry.minWorkerStake(), "worker slash at most the worker minimum");
        assertEq(job.spec().voterSlash, registry.minValidatorStake(), "voter slash at most the validator minimum");
        assertEq(job.spec().absentPenalty, registry.minValidatorStake() / 10, "absent penalty at most a tenth of it");
        assertEq(factory.jobCount(), 1, "only the capped job exists");
    }

    function test_requesterRejectsAndAppealsAnHonestBatch_andLoses() public {
        uint256 reqBefore = _holdings(requester);
        uint256 wBefore = _holdings(worker);
        uint256[3] memory hBefore = [_holdings(v1), _holdings(v2), _holdings(v3)];
        TrainingJob job = _createJob(s, BUDGET);
        uint256 cost = job.leaseCost();

        uint256 id = _submitted(job, worker, 0);
        _vote(job, requester, id, false);
        _vote(job, v1, id, true);
        _vote(job, v2, id, true);
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Accept), "round 0: honest majority");
        _appeal(job, requester, id);
        _vote(job, requester, id, false);
        _vote(job, v1, id, true);
        _vote(job, v2, id, true);
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Accept), "round 1");
        _appeal(job, requester, id);
        _vote(job, requester, id, false);
        _vote(job, v1, id, true);
        _vote(job, v3, id, true);
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Accept), "final round");
        job.finalize(id);
        job.slashLoser(id, requester);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "honest worker paid");

        _cashOut(job, id, worker);
        _cashOut(job, id, v1);
        _cashOut(job, id, v2);
        _cashOut(job, id, v3);
        uint256 balBefore = requester.balance;
        vm.prank(requester);
        job.close();
        assertEq(requester.balance - balBefore, BUDGET - cost, "close refunds the unspent budget only");

        // Honest worker: paid, stake whole.
        assertEq(_holdings(worker), wBefore + cost, "worker gains exactly its pay");
        assertEq(_active(worker), 5 ether, "worker keeps its stake");
        assertEq(_locked(worker), 0, "collateral released");
        // Honest validators: no loss (v1, v2, v3 gain from the requester's losses).
        address[3] memory honest = [v1, v2, v3];
        for (uint256 i = 0; i < 3; ++i) {
            assertEq(_loss(hBefore[i], _holdings(honest[i])), 0, "honest validator loses nothing");
        }
        assertGt(_holdings(v1), hBefore[0], "winning voter rewarded");
        // The requester: the work it paid for, plus both bonds and one voter slash.
        int256 gain = _gain(reqBefore, _holdings(requester));
        assertEq(uint256(-gain), cost + 3 * s.appealBond + s.voterSlash, "requester's exact loss");
        assertLtInt(gain + int256(cost), 0, "the attack itself costs the requester");
        _solvent(job);
    }

    function test_closeRefundsOnlyUnreservedEscrow_neverSlashedValue() public {
        uint256 reqBefore = _holdings(requester);
        TrainingJob job = _createJob(s, BUDGET);
        uint256 cost = job.leaseCost();
        // A cheat's batch is rejected: its collateral is slashed while another lease is still open.
        uint256 cheat = _submitted(job, worker2, 0);
        uint256 open = _claimReady(job, worker);
        _vote(job, v1, cheat, false);
        _vote(job, v2, cheat, false);
        vm.warp(uint256(_deadline(job, cheat)) + 1);
        job.finalize(cheat);
        assertGt(job.poolHeld(), 0, "slashed collateral held for the winners");

        uint256 bal = requester.balance;
        vm.prank(requester);
        job.close();
        assertEq(requester.balance - bal, BUDGET - cost, "the open lease's pay stays reserved");
        // The open lease expired long ago: its fee is burned, its reservation comes back, nothing else.
        assertGt(block.timestamp, uint256(_deadline(job, open)), "expired");
        job.reclaim(open);
        vm.prank(requester);
        job.close();
        assertEq(requester.balance - bal, BUDGET, "exactly the budget back, no slashed wei");
        assertEq(_holdings(requester), reqBefore, "requester gains nothing from the slash");
        _cashOut(job, cheat, v1);
        _cashOut(job, cheat, v2);
        assertEq(address(job).balance, job.burned() + job.poolHeld(), "slash went to voters and burn");
        assertEq(job.burned(), s.slashAmount / 10 + s.expiryFee, "burned: 10% of the slash and the expiry fee");
        _solvent(job);
    }

    /// @notice A requester with sybils holding a stake minority loses in every round where everyone sits.
    function test_sybilMinorityLosesEveryRound() public {
        address s1 = makeAddr("sybil1");
        address s2 = makeAddr("sybil2");
        vm.deal(s1, 10 ether);
        vm.deal(s2, 10 ether);
        _join(s1, VALIDATOR, MIN_VALIDATOR);
        _join(s2, VALIDATOR, MIN_VALIDATOR);
        _roll(1);
        JobSpec memory s9 = _spec();
        s9.committeeSize = 9; // W = 18: 9 * 2 >= 18, everyone sits
        address[3] memory sybils = [requester, s1, s2];
        uint256[3] memory sybBefore = [_holdings(requester), _holdings(s1), _holdings(s2)];
        uint256[3] memory hBefore = [_holdings(v1), _holdings(v2), _holdings(v3)];
        TrainingJob job = _createJob(s9, BUDGET);
        uint256 id = _submitted(job, worker, 0);
        for (uint256 r = 0; r <= s9.appealRounds; ++r) {
            for (uint256 i = 0; i < 3; ++i) {
                _vote(job, sybils[i], id, false);
            }
            assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Voting), "6 of 18 decides nothing");
            _vote(job, v1, id, true);
            _vote(job, v2, id, true);
            _vote(job, v3, id, true);
            assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Accept), "honest majority decides");
            if (r < s9.appealRounds) _appeal(job, sybils[r], id);
        }
        job.finalize(id);
        for (uint256 i = 0; i < 3; ++i) {
            job.slashLoser(id, sybils[i]);
        }
        _cashOut(job, id, v1);
        _cashOut(job, id, v2);
        _cashOut(job, id, v3);
        _cashOut(job, id, worker);
        vm.prank(requester);
        job.close();
        uint256 cost = job.leaseCost();
        int256 groupGain = _gain(sybBefore[0], _holdings(requester) + cost) + _gain(sybBefore[1], _holdings(s1))
            + _gain(sybBefore[2], _holdings(s2));
        assertLtInt(groupGain, 0, "the sybil group loses (beyond paying for the work)");
        assertEq(uint256(-groupGain), 3 * s9.voterSlash + 3 * s9.appealBond, "three slashes and both bonds");
        address[3] memory honest = [v1, v2, v3];
        for (uint256 i = 0; i < 3; ++i) {
            assertEq(_loss(hBefore[i], _holdings(honest[i])), 0, "honest validator loses nothing");
        }
        _solvent(job);
    }

    /// @notice With sampled committees a sybil minority may win a small first committee by luck, but the
    ///         final round seats every validator with its own stake: the minority loses and pays.
    function testFuzz_sybilMinorityInSampledCommittees(uint8 salt) public {
        address[5] memory syb;
        for (uint256 i = 0; i < 5; ++i) {
            syb[i] = makeAddr(string.concat("syb", string(abi.encodePacked(bytes1(uint8(65 + i))))));
            vm.deal(syb[i], 10 ether);
            _join(syb[i], VALIDATOR, MIN_VALIDATOR);
        }
        vm.prank(v1);
        registry.addStake{value: 6 ether}();
        vm.prank(v2);
        registry.addStake{value: 6 ether}();
        vm.prank(v3);
        registry.addStake{value: 6 ether}();
        // Honest 30, sybils 12 (requester + 5). W = 42; committee 3: everyone sampled.
        JobSpec memory sp = _spec();
        sp.committeeSize = 3;
        sp.appealRounds = 1;
        TrainingJob job = _createJob(sp, BUDGET);
        _roll(1 + uint256(salt)); // shifts every committee draw
        address[6] memory sybils = [requester, syb[0], syb[1], syb[2], syb[3], syb[4]];
        address[3] memory honest = [v1, v2, v3];
        uint256 sybBefore;
        for (uint256 i = 0; i < 6; ++i) {
            sybBefore += _wealth(job, sybils[i]);
        }
        uint256[3] memory hBefore = [_wealth(job, v1), _wealth(job, v2), _wealth(job, v3)];
        uint256 wBefore = _wealth(job, worker);

        uint256 id = _submitted(job, worker, 0);
        for (uint256 i = 0; i < 6; ++i) {
            if (_status(job, id) == TrainingJob.Status.Voting && job.memberWeight(id, 0, sybils[i]) > 0) {
                _vote(job, sybils[i], id, false);
            }
        }
        for (uint256 i = 0; i < 3; ++i) {
            if (_status(job, id) == TrainingJob.Status.Voting && job.memberWeight(id, 0, honest[i]) > 0) {
                _vote(job, honest[i], id, true);
            }
        }
        if (_status(job, id) == TrainingJob.Status.Voting) vm.warp(uint256(_deadline(job, id)) + 1);
        // Whoever lost round 0 appeals into the final round.
        bool acceptedFirst = job.outcomeOf(id) == TrainingJob.Outcome.Accept;
        _appeal(job, acceptedFirst ? requester : v1, id);
        for (uint256 i = 0; i < 6; ++i) {
            _vote(job, sybils[i], id, false);
        }
        for (uint256 i = 0; i < 3; ++i) {
            if (_status(job, id) == TrainingJob.Status.Voting) _vote(job, honest[i], id, true);
        }
        assertEq(
            uint256(_outcome(job, id)),
            uint256(TrainingJob.Outcome.Accept),
            "the stake majority decides the final round"
        );
        job.finalize(id);
        for (uint256 i = 0; i < 6; ++i) {
            job.slashLoser(id, sybils[i]); // every sybil voted against the final outcome
        }
        for (uint256 i = 0; i < 3; ++i) {
            _cashOut(job, id, honest[i]);
        }
        _cashOut(job, id, worker);
        uint256 sybAfter;
        for (uint256 i = 0; i < 6; ++i) {
            sybAfter += _wealth(job, sybils[i]);
        }
        assertLt(sybAfter, sybBefore, "the sybil group loses");
        assertGe(sybBefore - sybAfter, 6 * sp.voterSlash, "at least every sybil's slash");
        for (uint256 i = 0; i < 3; ++i) {
            assertEq(_loss(hBefore[i], _wealth(job, honest[i])), 0, "honest validator loses nothing");
        }
        assertEq(_wealth(job, worker), wBefore + job.leaseCost(), "honest worker paid");
        _solvent(job);
    }
}

// ======================================================================================================
// (2) Losing validators escape slashing: a ring, an ether-refusing appellant, and unbonding.
// ======================================================================================================

/// @title Attack2_LosersEscapeSlashingTest
/// @notice A ring votes for a cheat, appeals through a contract that refuses ether, and unbonds everything.
///         Nothing is pushed, so nothing can be blocked; the honest outcome wins on appeal; every ring member
///         is slashed (from unbonding stake); no ring member can withdraw before the slash can happen.
contract Attack2_LosersEscapeSlashingTest is AttackBase {
    address internal r1;
    address internal r2;
    address internal refuser;
    JobSpec internal s;
    TrainingJob internal job;

    function setUp() public {
        _start();
        r1 = makeAddr("ring1");
        r2 = makeAddr("ring2");
        vm.deal(r1, 100 ether);
        vm.deal(r2, 100 ether);
        refuser = address(new Puppet());
        vm.label(refuser, "refuser");
        _join(worker, WORKER, 5 ether); // the cheat, part of the ring
        _join(v1, VALIDATOR, 4 ether);
        _join(v2, VALIDATOR, 4 ether);
        _join(v3, VALIDATOR, 4 ether);
        _join(r1, VALIDATOR, MIN_VALIDATOR);
        _join(r2, VALIDATOR, MIN_VALIDATOR);
        _joinPuppet(refuser, VALIDATOR, MIN_VALIDATOR);
        vm.deal(refuser, 10 ether);
        _roll(1);
        s = _spec();
        s.committeeSize = 9; // W = 18: 9 * 2 >= 18, everyone sits
        job = _createJob(s, BUDGET);
    }

    function _ringVote(uint256 id) internal {
        _vote(job, r1, id, true);
        _vote(job, r2, id, true);
        _exec(refuser, address(job), 0, abi.encodeCall(TrainingJob.vote, (id, true)));
    }

    function _honestReject(uint256 id) internal {
        _vote(job, v1, id, false);
        _vote(job, v2, id, false);
        _vote(job, v3, id, false);
    }

    function test_ringIsSlashedEvenAfterUnbondingAndWithAnEtherRefusingAppellant() public {
        address[4] memory ring = [worker, r1, r2, refuser];
        uint256 ringBefore;
        for (uint256 i = 0; i < 4; ++i) {
            ringBefore += _holdings(ring[i]);
        }
        uint256[4] memory each = [_holdings(worker), _holdings(r1), _holdings(r2), _holdings(refuser)];
        uint256[3] memory hBefore = [_holdings(v1), _holdings(v2), _holdings(v3)];
        uint256 reqBefore = _holdings(requester) + BUDGET;

        uint256 id = _submitted(job, worker, 0); // a cheat's batch
        _ringVote(id);
        _honestReject(id);
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Reject), "round 0 rejects");
        // The refusing contract appeals first.
        uint256 bond1 = job.appealBondFor(1);
        _exec(refuser, address(job), bond1, abi.encodeCall(TrainingJob.appeal, (id)));
        _roll(1);
        _ringVote(id);
        _honestReject(id);
        _appeal(job, r1, id);
        _ringVote(id);
        // The ring unbonds everything right after its last vote.
        vm.prank(r1);
        registry.requestUnbond(MIN_VALIDATOR);
        vm.prank(r2);
        registry.requestUnbond(MIN_VALIDATOR);
        _exec(refuser, address(registry), 0, abi.encodeCall(NodeRegistry.requestUnbond, (MIN_VALIDATOR)));
        _honestReject(id);
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Reject), "final round rejects");

        // Settlement pushes nothing: the refusing appellant cannot block it.
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "cheat slashed");
        // No ring member can withdraw yet...
        (,,,,, uint64 readyAt) = registry.nodeInfo(r1);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, readyAt));
        vm.prank(r1);
        registry.withdraw();
        assertGt(uint256(readyAt), block.timestamp + factory.KEEPER_MARGIN(), "a day and more to slash");
        // ...and every one of them is slashed from unbonding stake.
        address[3] memory voters = [r1, r2, refuser];
        for (uint256 i = 0; i < 3; ++i) {
            job.slashLoser(id, voters[i]);
            assertEq(_unbonding(voters[i]), MIN_VALIDATOR - s.voterSlash, "slashed from unbonding");
        }
        _cashOut(job, id, v1);
        _cashOut(job, id, v2);
        _cashOut(job, id, v3);
        vm.prank(requester);
        job.close();

        vm.warp(readyAt);
        vm.prank(r1);
        registry.withdraw();
        assertEq(_unbonding(r1), 0, "only the rest withdrawn");

        uint256 ringAfter;
        for (uint256 i = 0; i < 4; ++i) {
            ringAfter += _holdings(ring[i]);
            assertLt(_holdings(ring[i]), each[i], "every ring member loses");
        }
        assertEq(ringBefore - ringAfter, s.slashAmount + 3 * s.voterSlash + 3 * s.appealBond, "ring's exact loss");
        address[3] memory honest = [v1, v2, v3];
        for (uint256 i = 0; i < 3; ++i) {
            assertEq(_loss(hBefore[i], _holdings(honest[i])), 0, "honest validator loses nothing");
            assertGt(_holdings(honest[i]), hBefore[i], "and is rewarded");
        }
        assertEq(_holdings(requester), reqBefore, "requester gets its whole budget back");
        _solvent(job);
    }

    /// @notice An ether-refusing appellant that wins gets its refund credited, and nobody else is held up.
    function test_refusingWinnerCannotBlockSettlementOrOthers() public {
        uint256 id = _submitted(job, worker, 0);
        _vote(job, r1, id, true); // the only vote: round 0 accepts the cheat at its deadline
        vm.warp(uint256(_deadline(job, id)) + 1);
        uint256 bond1 = job.appealBondFor(1);
        _exec(refuser, address(job), bond1, abi.encodeCall(TrainingJob.appeal, (id)));
        _roll(1);
        _honestReject(id);
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.finalize(id); // would have pushed a refund to a reverting receiver before
        assertEq(job.owed(refuser), bond1, "refund credited, not pushed");
        job.slashLoser(id, r1);
        _cashOut(job, id, v1);
        _cashOut(job, id, v2);
        assertEq(job.owed(v1), 0, "others withdraw regardless");
        // The refuser's own withdrawal fails only for itself, until it accepts ether.
        vm.prank(refuser);
        job.claimReward(id);
        vmx.expectRevert();
        _exec(refuser, address(job), 0, abi.encodeCall(TrainingJob.withdrawPayment, ()));
        Puppet(payable(refuser)).setAcceptEther(true);
        uint256 owedToRefuser = job.owed(refuser);
        uint256 bal = refuser.balance;
        _exec(refuser, address(job), 0, abi.encodeCall(TrainingJob.withdrawPayment, ()));
        assertEq(refuser.balance, bal + owedToRefuser, "bond and appellant reward withdrawn");
        assertGt(owedToRefuser, bond1, "a winning appellant earns a share");
        _solvent(job);
    }
}

/// @title Attack2b_LoserShieldsStakeAsCollateralTest
/// @notice A losing voter tries to hide its stake as lease collateral before the keeper's slashLoser. An
///         address holds one staked role, so a validator cannot lock collateral at all (and the registry's
///         slash would reach locked stake last anyway): the full voter slash is taken.
contract Attack2b_LoserShieldsStakeAsCollateralTest is AttackBase {
    address internal rb;

    function setUp() public {
        _start();
        rb = makeAddr("ringBoth");
        vm.deal(rb, 100 ether);
        _join(worker, WORKER, 5 ether);
        _join(v1, VALIDATOR, 4 ether);
        _join(v2, VALIDATOR, 4 ether);
        _join(v3, VALIDATOR, 4 ether);
        _roll(1);
    }

    /// @notice rb wants both roles, to vote with its stake and lock that stake as collateral: refused. As a
    ///         validator it votes for a cheat and loses; its attempt to lock its stake as collateral on another
    ///         job fails (it is no worker), so slashLoser takes the full voter slash (found by review: with a
    ///         shared stake, the slash once took 0 and the collateral came back when the leases ended).
    function test_losingVoterCannotShieldItsStakeAsLeaseCollateral() public {
        uint256 key = _peerKey(rb);
        bytes memory pid = _peerIdOf(key);
        bytes memory sig = _peerSig(registry, key, rb);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, BOTH));
        vm.prank(rb);
        registry.join{value: MIN_VALIDATOR}(pid, sig, BOTH);
        _join(rb, VALIDATOR, MIN_VALIDATOR); // W = 14
        _roll(1);

        JobSpec memory sp = _spec();
        sp.committeeSize = 8; // 8 * 2 >= 14: everyone sits
        TrainingJob job = _createJob(sp, BUDGET);
        TrainingJob other = _createJob(_spec(), BUDGET);
        uint256 before = _holdings(rb);
        uint256[3] memory hBefore = [_holdings(v1), _holdings(v2), _holdings(v3)];
        uint256 id = _submitted(job, worker, 0);
        assertEq(job.memberWeight(id, 0, rb), MIN_VALIDATOR, "rb sits with its whole stake");
        _vote(job, rb, id, true);
        _vote(job, v1, id, false);
        _vote(job, v2, id, false);
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Reject), "rb lost");
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, rb, WORKER));
        vm.prank(rb);
        other.claim();
        assertEq(_locked(rb), 0, "a validator locks no collateral");
        assertEq(_active(rb), MIN_VALIDATOR, "its whole stake stays slashable");
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.finalize(id);
        job.slashLoser(id, rb);
        uint256 lost = before - _holdings(rb);
        assertEq(lost, sp.voterSlash, "a losing voter escaped its slash by locking its stake as collateral");
        _cashOut(job, id, v1);
        _cashOut(job, id, v2);
        address[3] memory honest = [v1, v2, v3];
        for (uint256 i = 0; i < 3; ++i) {
            assertEq(_loss(hBefore[i], _holdings(honest[i])), 0, "honest validator loses nothing");
        }
        _solvent(job);
    }
}

// ======================================================================================================
// (3) One minimum stake locks the whole budget.
// ======================================================================================================

/// @title Attack3_OneStakeLocksBudgetTest
/// @notice Each lease locks `slashAmount` of free stake up front: a minimum stake holds at most
///         stake / slashAmount leases, abandoning leases costs the expiry fee each time, and rejected
///         leases cost a full slash each.
contract Attack3_OneStakeLocksBudgetTest is AttackBase {
    JobSpec internal s;
    TrainingJob internal job;
    address internal attacker;

    function setUp() public {
        _start();
        attacker = makeAddr("attacker");
        vm.deal(attacker, 100 ether);
        _join(worker2, WORKER, 5 ether);
        _join(v1, VALIDATOR, 5 ether);
        _join(v2, VALIDATOR, 5 ether);
        _join(v3, VALIDATOR, 5 ether);
        _roll(1);
        s = _spec();
        job = _createJob(s, 100 * _cost(s));
    }

    function test_minimumStakeHoldsOnlyStakeOverSlashLeases() public {
        _join(attacker, WORKER, MIN_WORKER);
        uint256 cost = job.leaseCost();
        uint256 held = MIN_WORKER / s.slashAmount;
        for (uint256 i = 0; i < held; ++i) {
            _claim(job, attacker);
        }
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, s.slashAmount, 0));
        vm.prank(attacker);
        job.claim();
        assertEq(job.reserved(), held * cost, "two leases of a hundred reserved");
        assertEq(job.escrow() - job.reserved(), 98 * cost, "the rest of the budget stays claimable");
        _claim(job, worker2);
        assertEq(job.getLease(job.leaseCount()).worker, worker2, "honest workers still claim");
        _solvent(job);
    }

    function testFuzz_leasesHeldBoundedByStake(uint256 stake, uint256 slash) public {
        slash = bound(slash, 0.1 ether, MIN_WORKER);
        stake = bound(stake, MIN_WORKER, 5 ether);
        JobSpec memory sp = _spec();
        sp.slashAmount = slash;
        sp.expiryFee = slash / 10;
        TrainingJob j = _createJob(sp, 100 * _cost(sp));
        _join(attacker, WORKER, stake);
        uint256 n = stake / slash;
        for (uint256 i = 0; i < n; ++i) {
            _claim(j, attacker);
        }
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, slash, stake - n * slash));
        vm.prank(attacker);
        j.claim();
        assertEq(_locked(attacker), n * slash, "every lease is backed by locked collateral");
        assertLe(j.reserved(), stake * j.leaseCost() / slash, "budget locked is proportional to stake");
        _solvent(j);
    }

    function test_reclaimAndClaimCyclesCostTheFeeEachTime() public {
        _join(attacker, WORKER, 2 ether);
        uint256 before = _wealth(job, attacker);
        uint256 cycles = 10;
        for (uint256 i = 0; i < cycles; ++i) {
            uint256 id = _claim(job, attacker);
            assertEq(uint256(job.getLease(id).firstTask), 0, "the same tasks come back");
            vm.warp(uint256(_deadline(job, id)) + 1);
            job.reclaim(id);
        }
        int256 gain = _gain(before, _wealth(job, attacker));
        assertEq(uint256(-gain), cycles * s.expiryFee, "one expiry fee per cycle");
        assertEq(job.burned(), cycles * s.expiryFee, "all burned");
        assertEq(job.escrow(), 100 * job.leaseCost(), "budget untouched");
        assertEq(job.reserved(), 0, "nothing stays locked");
        _solvent(job);
    }

    function test_minimumStakeWorkerCannotEvenCycleWithoutToppingUp() public {
        _join(attacker, WORKER, MIN_WORKER);
        uint256 id = _claim(job, attacker);
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.reclaim(id);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, attacker, WORKER));
        vm.prank(attacker);
        job.claim();
        assertEq(_active(attacker), MIN_WORKER - s.expiryFee, "the fee took it below the minimum");
    }

    function test_tenRejectedLeasesCostTenFullSlashes() public {
        _join(attacker, WORKER, 6 ether);
        uint256 before = _wealth(job, attacker);
        uint256[3] memory hBefore = [_wealth(job, v1), _wealth(job, v2), _wealth(job, v3)];
        uint256 reqBefore = requester.balance;
        uint256[] memory ids = new uint256[](10);
        for (uint256 i = 0; i < 10; ++i) {
            ids[i] = _claimReady(job, attacker);
        }
        assertEq(_locked(attacker), 10 * s.slashAmount, "ten collaterals locked up front");
        for (uint256 i = 0; i < 10; ++i) {
            _submit(job, attacker, ids[i], 0); // garbage
            _vote(job, v2, ids[i], false);
            _vote(job, v3, ids[i], false);
        }
        vm.warp(uint256(_deadline(job, ids[9])) + 1);
        for (uint256 i = 0; i < 10; ++i) {
            job.finalize(ids[i]);
            _cashOut(job, ids[i], v2);
            _cashOut(job, ids[i], v3);
        }
        assertEq(before - _wealth(job, attacker), 10 * s.slashAmount, "ten full slashes");
        assertEq(_locked(attacker), 0, "nothing left locked");
        address[3] memory honest = [v1, v2, v3];
        for (uint256 i = 0; i < 3; ++i) {
            assertEq(_loss(hBefore[i], _wealth(job, honest[i])), 0, "honest validators lose nothing");
        }
        vm.prank(requester);
        job.close();
        assertEq(requester.balance - reqBefore, 100 * job.leaseCost(), "requester's whole budget back");
        _solvent(job);
    }
}

// ======================================================================================================
// (4) Workers pick their prompts.
// ======================================================================================================

/// @title Attack4_PickPromptsTest
/// @notice The prompt seed is the claim block's hash, drawn in a later transaction: the claiming
///         transaction cannot see it, it does not depend on who draws it or when, and re-rolling costs a fee.
contract Attack4_PickPromptsTest is AttackBase {
    JobSpec internal s;
    TrainingJob internal job;
    SeedPeeker internal peeker;

    function setUp() public {
        _start();
        peeker = new SeedPeeker();
        vm.label(address(peeker), "peeker");
        _joinPuppet(address(peeker), WORKER, 2 ether);
        _join(worker, WORKER, 5 ether);
        _roll(1);
        s = _spec();
        job = _createJob(s, BUDGET);
    }

    function test_claimingContractSeesNoSeedAndCannotDrawIt() public {
        (uint256 id, bytes32 seen, bytes memory err) = peeker.claimAndPeek(job);
        assertEq(seen, bytes32(0), "no seed in the claiming transaction");
        assertEq(err, abi.encodeWithSelector(TrainingJob.RandomnessNotReady.selector, block.number), "drawSeed refused");
        assertEq(job.getLease(id).seed, bytes32(0), "still undrawn");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.RandomnessNotReady.selector, block.number));
        job.drawSeed(id);
        _roll(1);
        job.drawSeed(id);
        assertNotEq(job.getLease(id).seed, bytes32(0), "drawn a block later");
    }

    function test_seedDoesNotDependOnCallerOrTime() public {
        uint256 id = _claim(job, worker);
        uint256 claimBlock = block.number;
        uint256 snap = vmx.snapshotState();
        address[3] memory callers = [worker, outsider, requester];
        uint256[3] memory delays = [uint256(1), 200, 256];
        bytes32 first;
        for (uint256 i = 0; i < 3; ++i) {
            vmx.revertToState(snap);
            vm.roll(claimBlock + delays[i]);
            _warp(delays[i] * 12);
            bytes32 expected = keccak256(abi.encode(blockhash(claimBlock), address(job), id));
            vm.prank(callers[i]);
            job.drawSeed(id);
            bytes32 seed = job.getLease(id).seed;
            assertEq(seed, expected, "the claim block's hash");
            if (i == 0) first = seed;
            assertEq(seed, first, "same seed whoever draws it, whenever");
        }
    }

    function testFuzz_seedDoesNotDependOnCallerOrTime(uint256 delay, address caller) public {
        delay = bound(delay, 1, 256);
        vmx.assume(caller != address(vm));
        uint256 id = _claim(job, worker);
        uint256 claimBlock = block.number;
        uint256 snap = vmx.snapshotState();
        vm.roll(claimBlock + 1);
        job.drawSeed(id);
        bytes32 firstSeed = job.getLease(id).seed;
        vmx.revertToState(snap);
        vm.roll(claimBlock + delay);
        vm.warp(block.timestamp + delay);
        vm.prank(caller);
        job.drawSeed(id);
        assertEq(job.getLease(id).seed, firstSeed, "seed independent of caller and delay");
    }

    function test_claimAndAbandonCostsTheExpiryFee() public {
        uint256 before = _wealth(job, address(peeker));
        bytes32 lastSeed;
        for (uint256 i = 0; i < 3; ++i) {
            (uint256 id,,) = peeker.claimAndPeek(job);
            _roll(1);
            job.drawSeed(id);
            bytes32 seed = job.getLease(id).seed;
            assertNotEq(seed, lastSeed, "a new claim block, a new seed");
            lastSeed = seed;
            // It dislikes its prompts and abandons the lease.
            vm.warp(uint256(_deadline(job, id)) + 1);
            job.reclaim(id);
        }
        assertEq(before - _wealth(job, address(peeker)), 3 * s.expiryFee, "every re-roll costs the fee");
        _solvent(job);
    }

    function test_seedNeverDrawnWithin256BlocksOnlyExpires() public {
        uint256 before = _wealth(job, worker);
        uint256 id = _claim(job, worker);
        uint256 claimBlock = block.number;
        vm.roll(claimBlock + 257);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.RandomnessExpired.selector, claimBlock));
        job.drawSeed(id);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.SeedNotDrawn.selector, id));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.reclaim(id);
        assertEq(before - _wealth(job, worker), s.expiryFee, "waiting for a lost seed costs the fee");
    }
}

// ======================================================================================================
// (5) Challenges are free.
// ======================================================================================================

/// @title Attack5_FreeChallengesTest
/// @notice An appeal of a correct decision forfeits its bond (to the winners, 10% burned); bonds and
///         slashes of zero are refused by the factory.
contract Attack5_FreeChallengesTest is AttackBase {
    JobSpec internal s;
    address internal griefer;

    function setUp() public {
        _start();
        griefer = worker2;
        _join(worker, WORKER, 5 ether);
        _join(griefer, WORKER, 5 ether);
        _join(v1, VALIDATOR, 5 ether);
        _join(v2, VALIDATOR, 5 ether);
        _join(v3, VALIDATOR, 5 ether);
        _roll(1);
        s = _spec();
    }

    function _grief(TrainingJob job, uint256 rounds) internal returns (uint256 id) {
        id = _submitted(job, worker, 0);
        _vote(job, v1, id, true);
        _vote(job, v2, id, true);
        for (uint256 r = 0; r < rounds; ++r) {
            _appeal(job, griefer, id);
            _vote(job, v1, id, true);
            _vote(job, v2, id, true);
        }
        if (job.getLease(id).round < job.spec().appealRounds) vm.warp(uint256(_deadline(job, id)) + 1);
        job.finalize(id);
    }

    function test_griefingAppealLosesItsBondToTheWinners() public {
        TrainingJob job = _createJob(s, BUDGET);
        uint256 gBefore = _wealth(job, griefer);
        uint256[3] memory hBefore = [_wealth(job, worker), _wealth(job, v1), _wealth(job, v2)];
        uint256 id = _grief(job, 1);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "the correct decision stands");
        _cashOut(job, id, worker);
        _cashOut(job, id, v1);
        _cashOut(job, id, v2);
        assertEq(gBefore - _wealth(job, griefer), s.appealBond, "griefer loses its bond");
        assertEq(job.burned(), s.appealBond / 10, "10% burned");
        uint256 toWinners = s.appealBond - s.appealBond / 10;
        assertEq(_wealth(job, v1) - hBefore[1], toWinners / 2, "v1's share");
        assertEq(_wealth(job, v2) - hBefore[2], toWinners / 2, "v2's share");
        assertEq(_wealth(job, worker) - hBefore[0], job.leaseCost(), "worker paid, nothing lost");
        _solvent(job);
    }

    function test_griefingToTheFinalRoundLosesEveryBond() public {
        TrainingJob job = _createJob(s, BUDGET);
        uint256 gBefore = _wealth(job, griefer);
        uint256 v3Before = _wealth(job, v3);
        uint256 id = _grief(job, 2);
        _cashOut(job, id, worker);
        assertEq(gBefore - _wealth(job, griefer), 3 * s.appealBond, "0.2 + 0.4 lost");
        assertEq(job.rewardOf(id, griefer), 0, "no appellant share for a losing appeal");
        assertEq(_wealth(job, v3), v3Before, "a member not needed (rounds decided early) is not penalized");
        _solvent(job);
    }

    function test_zeroBondAndZeroSlashSpecsRefused() public {
        JobSpec memory z = _spec();
        z.appealBond = 0;
        vm.expectRevert(_invalid("appealBond"));
        factory.validateSpec(z);
        z = _spec();
        z.slashAmount = 0;
        vm.expectRevert(_invalid("slashAmount"));
        factory.validateSpec(z);
        z = _spec();
        z.voterSlash = 0;
        vm.expectRevert(_invalid("voterSlash"));
        factory.validateSpec(z);
        z = _spec();
        z.absentPenalty = 0;
        vm.expectRevert(_invalid("absentPenalty"));
        factory.validateSpec(z);
        z = _spec();
        z.expiryFee = 0;
        vm.expectRevert(_invalid("expiryFee"));
        vm.prank(requester);
        factory.createJob{value: BUDGET}(z);
        assertEq(factory.jobCount(), 0, "no free-challenge job exists");
    }

    function testFuzz_griefingAppealAlwaysCostsTheBond(uint256 bond) public {
        bond = bound(bond, 1, 10 ether);
        JobSpec memory sp = _spec();
        sp.appealBond = bond;
        TrainingJob job = _createJob(sp, BUDGET);
        uint256 gBefore = _wealth(job, griefer);
        uint256 hBefore = _wealth(job, v1) + _wealth(job, v2);
        uint256 id = _grief(job, 1);
        _cashOut(job, id, v1);
        _cashOut(job, id, v2);
        assertEq(gBefore - _wealth(job, griefer), bond, "exactly the bond");
        assertEq(job.burned(), bond / 10, "burn share");
        uint256 gained = _wealth(job, v1) + _wealth(job, v2) - hBefore;
        assertLe(gained, bond - bond / 10, "winners get at most the rest");
        assertLe(bond - bond / 10 - gained, 2, "and all of it but rounding");
        _solvent(job);
    }
}

// ======================================================================================================
// (6) The timeline leaves no slack.
// ======================================================================================================

/// @title Attack6_TimelineSlackTest
/// @notice With a spec at the timeline limit (timeline == unbonding - 1) and every step taken at its last
///         possible second, a voter that unbonds right after its snapshot is still slashable after the
///         latest possible final outcome, and cannot withdraw until `readyAt`.
contract Attack6_TimelineSlackTest is AttackBase {
    address internal vBad;
    JobSpec internal s;
    TrainingJob internal job;

    function setUp() public {
        _start();
        vBad = makeAddr("vBad");
        vm.deal(vBad, 100 ether);
        _join(worker, WORKER, 5 ether);
        _join(v1, VALIDATOR, MIN_VALIDATOR);
        _join(v2, VALIDATOR, MIN_VALIDATOR); // honest but idle: keeps every round from an early decision
        _join(vBad, VALIDATOR, MIN_VALIDATOR);
        _roll(1);
        s = _spec();
        s.committeeSize = 3; // W = 6: 3 * 2 >= 6, everyone sits
        s.voteWindow = 1 hours;
        s.appealWindow = 1 days;
        s.leaseDuration = 0;
        s.leaseDuration = uint64(UNBONDING - 1 - factory.timeline(s));
        assertEq(factory.timeline(s), UNBONDING - 1, "spec at the limit");
        job = _createJob(s, BUDGET);
    }

    /// @dev The slowest legal path: submit, vote, appeal each at its last second. Returns the submission
    ///      time and the final round's vote deadline (the latest possible final outcome).
    function _slowestDispute(uint256 unbondDelay) internal returns (uint256 id, uint256 ts, uint256 tFinal) {
        id = _claimReady(job, worker);
        vm.warp(uint256(_deadline(job, id)));
        ts = block.timestamp;
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        _roll(1);
        _vote(job, vBad, id, true);
        // vBad unbonds after the round-0 snapshot, `unbondDelay` seconds after the submission at most.
        _warp(unbondDelay);
        vm.prank(vBad);
        registry.requestUnbond(MIN_VALIDATOR);
        vm.warp(uint256(_deadline(job, id)) + 1); // round 0 closes: Accept (2 of 6)
        vm.warp(uint256(_deadline(job, id)) + s.appealWindow);
        _appeal(job, v1, id);
        vm.warp(uint256(_deadline(job, id)));
        _vote(job, v1, id, false); // 2 of 4: not decisive
        vm.warp(uint256(_deadline(job, id)) + s.appealWindow);
        _appeal(job, worker, id);
        vm.warp(uint256(_deadline(job, id)));
        _vote(job, v1, id, false);
        tFinal = _deadline(job, id);
        vm.warp(tFinal + 1);
    }

    function test_unbondingVoterStaysSlashableAfterTheLatestFinalOutcome() public {
        uint256 before = _holdings(vBad);
        (uint256 id, uint256 ts, uint256 tFinal) = _slowestDispute(0);
        assertEq(tFinal, ts + 3 * s.voteWindow + 2 * s.appealWindow, "the latest final outcome");
        (,,,,, uint64 readyAt) = registry.nodeInfo(vBad);
        assertEq(uint256(readyAt), ts + UNBONDING, "unbonded at the submission second");
        assertEq(uint256(readyAt) - (tFinal + 1), s.leaseDuration + factory.KEEPER_MARGIN(), "slack = lease + margin");
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, readyAt));
        vm.prank(vBad);
        registry.withdraw();
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "final: reject");
        job.slashLoser(id, vBad);
        assertEq(_unbonding(vBad), MIN_VALIDATOR - s.voterSlash, "slashed from unbonding");
        vm.warp(readyAt);
        vm.prank(vBad);
        registry.withdraw();
        assertEq(before - _holdings(vBad), s.voterSlash, "vBad loses its slash");
        _solvent(job);
    }

    function test_boundarySecond_slashAtReadyAtMinusOne_withdrawAtReadyAt() public {
        uint256 before = _holdings(vBad);
        (uint256 id,,) = _slowestDispute(0);
        (,,,,, uint64 readyAt) = registry.nodeInfo(vBad);
        vm.warp(readyAt - 1);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, readyAt));
        vm.prank(vBad);
        registry.withdraw();
        // The slowest keeper, at the last second, still slashes.
        job.finalize(id);
        job.slashLoser(id, vBad);
        vm.warp(readyAt);
        vm.prank(vBad);
        registry.withdraw();
        assertEq(before - _holdings(vBad), s.voterSlash, "slashed at readyAt - 1");
        _solvent(job);
    }

    /// @notice The exact end of the protection: at `readyAt` (a lease duration plus the keeper margin after
    ///         the latest final outcome) an unslashed voter may leave. Nothing earlier works.
    function test_boundarySecond_protectionEndsExactlyAtReadyAt() public {
        (uint256 id, uint256 ts,) = _slowestDispute(0);
        (,,,,, uint64 readyAt) = registry.nodeInfo(vBad);
        assertEq(uint256(readyAt), ts + UNBONDING, "readyAt");
        vm.warp(readyAt - 1);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, readyAt));
        vm.prank(vBad);
        registry.withdraw();
        vm.warp(readyAt);
        vm.prank(vBad);
        registry.withdraw();
        job.finalize(id);
        job.slashLoser(id, vBad);
        assertEq(_unbonding(vBad) + _active(vBad), 0, "nothing left once withdrawn at readyAt");
        _solvent(job);
    }

    function testFuzz_unbondAnyTimeAfterSnapshotStaysSlashable(uint256 unbondDelay) public {
        // Any unbond between the round-0 snapshot and the last vote of round 0.
        unbondDelay = bound(unbondDelay, 0, s.voteWindow - 1);
        uint256 before = _holdings(vBad);
        (uint256 id,, uint256 tFinal) = _slowestDispute(unbondDelay);
        (,,,,, uint64 readyAt) = registry.nodeInfo(vBad);
        assertGt(uint256(readyAt), tFinal + factory.KEEPER_MARGIN(), "a full keeper margin after the final outcome");
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, readyAt));
        vm.prank(vBad);
        registry.withdraw();
        job.finalize(id);
        job.slashLoser(id, vBad);
        vm.warp(readyAt);
        vm.prank(vBad);
        registry.withdraw();
        assertEq(before - _holdings(vBad), s.voterSlash, "always slashed");
    }
}

// ======================================================================================================
// (7) Versions can skip.
// ======================================================================================================

/// @title Attack7_VersionSkipTest
/// @notice The policy clock is contiguous: only current + 1 can be published, and a batch can only claim a
///         published version.
contract Attack7_VersionSkipTest is AttackBase {
    TrainingJob internal job;

    function setUp() public {
        _start();
        _join(worker, WORKER, 5 ether);
        _roll(1);
        job = _createJob(_spec(), BUDGET);
    }

    function test_publishCannotSkip() public {
        uint256 trainerBefore = _wealth(job, trainer);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotNext.selector, uint64(0), uint64(2)));
        vm.prank(trainer);
        job.publishPolicy(2, bytes32(uint256(2)));
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotNext.selector, uint64(0), type(uint64).max));
        vm.prank(trainer);
        job.publishPolicy(type(uint64).max, bytes32(uint256(2)));
        vm.prank(trainer);
        job.publishPolicy(1, bytes32(uint256(1)));
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotNext.selector, uint64(1), uint64(3)));
        vm.prank(trainer);
        job.publishPolicy(3, bytes32(uint256(3)));
        assertEq(uint256(job.currentVersion()), 1, "one step at a time");
        assertEq(job.policyRoot(2), bytes32(0), "no root for a skipped version");
        assertEq(_wealth(job, trainer), trainerBefore, "the trainer gains nothing (and has no other power)");
        _solvent(job);
    }

    function test_submitAtUnpublishedVersionRefused() public {
        uint256 before = _wealth(job, worker);
        uint256 id = _claimReady(job, worker);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnpublishedPolicy.selector, uint64(1), uint64(0)));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 1);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnpublishedPolicy.selector, type(uint64).max, uint64(0)));
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), type(uint64).max);
        vm.prank(worker);
        job.submit(id, bytes32(uint256(1)), 0);
        assertEq(uint256(job.getLease(id).policyVersion), 0, "only a published version");
        assertEq(_wealth(job, worker), before, "an honest submission costs nothing");
    }

    function testFuzz_versionCannotJump(uint64 v) public {
        vm.prank(trainer);
        job.publishPolicy(1, bytes32(uint256(1)));
        vmx.assume(v != 2);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.VersionNotNext.selector, uint64(1), v));
        vm.prank(trainer);
        job.publishPolicy(v, bytes32(uint256(9)));
        assertEq(uint256(job.currentVersion()), 1, "unchanged");
        uint256 id = _claimReady(job, worker);
        if (v > 1) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.UnpublishedPolicy.selector, v, uint64(1)));
            vm.prank(worker);
            job.submit(id, bytes32(uint256(1)), v);
        }
    }
}

// ======================================================================================================
// (8) Peer IDs can be squatted.
// ======================================================================================================

/// @title Attack8_PeerSquatTest
/// @notice A peer ID binds only with its own key's signature over (chain, registry, address): squatting
///         without the key, replaying the owner's signature from another address, or replaying one made for
///         another registry or chain all fail, and the owner registers afterwards.
contract Attack8_PeerSquatTest is AttackBase {
    address internal squatter;
    uint256 internal ownerKey;
    bytes internal ownerId;

    function setUp() public {
        _start();
        squatter = makeAddr("squatter");
        vm.deal(squatter, 100 ether);
        ownerKey = _peerKey(worker);
        ownerId = _peerIdOf(ownerKey);
    }

    function _squat(bytes memory sig) internal {
        bytes memory id = ownerId;
        vm.expectRevert(NodeRegistry.PeerSignatureInvalid.selector);
        vm.prank(squatter);
        registry.join{value: MIN_WORKER}(id, sig, WORKER);
    }

    function test_squatAttemptsFailAndTheOwnerStillRegisters() public {
        uint256 before = _holdings(squatter);
        // Its own key's signature.
        _squat(_peerSig(registry, _peerKey(squatter), squatter));
        // The owner's signature, front-run from the mempool (made for the owner's address).
        bytes memory ownerSig = _peerSig(registry, ownerKey, worker);
        _squat(ownerSig);
        // The owner's signature for another registry.
        NodeRegistry other = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        _squat(_peerSig(other, ownerKey, squatter));
        // The owner's signature for the same registry address on another chain.
        uint256 home = block.chainid;
        vmx.chainId(home + 7);
        bytes memory elsewhere = _peerSig(registry, ownerKey, squatter);
        vmx.chainId(home);
        _squat(elsewhere);
        assertEq(registry.ownerOfPeer(ownerId), address(0), "never bound");
        assertEq(_holdings(squatter), before, "squatter gains nothing");

        bytes memory id = ownerId;
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(id, ownerSig, WORKER);
        assertEq(registry.ownerOfPeer(ownerId), worker, "the owner registers afterwards");
        _assertRegistrySolvent();
    }

    function test_squatViaSetPeerIdFails() public {
        _join(squatter, WORKER, MIN_WORKER);
        bytes memory ownerSig = _peerSig(registry, ownerKey, worker);
        bytes memory id = ownerId;
        vm.expectRevert(NodeRegistry.PeerSignatureInvalid.selector);
        vm.prank(squatter);
        registry.setPeerId(id, ownerSig);
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(id, ownerSig, WORKER);
        assertEq(registry.ownerOfPeer(ownerId), worker, "owner bound");
        (bytes memory squatterPeer,,,,,) = registry.nodeInfo(squatter);
        assertEq(squatterPeer, _peerIdOf(_peerKey(squatter)), "squatter kept its own ID");
    }

    function testFuzz_noForeignKeyBindsTheOwnersId(uint256 key) public {
        key = bound(key, 1, 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364140);
        vmx.assume(vm.addr(key) != vm.addr(ownerKey));
        _squat(_peerSig(registry, key, squatter));
        _squat(_peerSig(registry, key, worker));
        assertEq(registry.ownerOfPeer(ownerId), address(0), "unbound");
    }
}

// ======================================================================================================
// (9) A requester farms absence penalties from validators that never followed its job.
// ======================================================================================================

/// @title Attack9_AbsentPenaltyFarmTest
/// @notice Committees are drawn from every validator of the shared registry. A requester creates a job with
///         the shortest allowed windows (MIN_WINDOW) and the largest allowed absent penalty (a tenth of a
///         voter slash at the validator minimum), submits leases from its own worker and votes alone with its
///         own validator, so no round reaches a majority and every round runs to its deadline; it appeals its
///         own decisions up to the final round, which seats every validator. The honest validators never
///         enlisted in its job (two of them follow an honest job): every penalizeAbsent on a drawn honest
///         member reverts NotEnlisted, the honest validators lose nothing, and the attacker gains nothing.
contract Attack9_AbsentPenaltyFarmTest is AttackBase {
    address internal aWorker;
    address internal aValidator;
    address[3] internal honest;

    function setUp() public {
        _start();
        aWorker = makeAddr("attackerWorker");
        aValidator = makeAddr("attackerValidator");
        vm.deal(aWorker, 100 ether);
        vm.deal(aValidator, 100 ether);
        _join(v1, VALIDATOR, 5 ether);
        _join(v2, VALIDATOR, 5 ether);
        _join(v3, VALIDATOR, 5 ether);
        _join(aWorker, WORKER, 5 ether);
        _join(aValidator, VALIDATOR, MIN_VALIDATOR); // W = 17; committee 3: 3 * 5 < 17, earlier rounds sample
        _roll(1);
        honest = [v1, v2, v3];
    }

    /// @dev The harshest spec the factory accepts for absence: shortest windows, largest absent penalty.
    function _evilSpec() internal view returns (JobSpec memory sp) {
        sp = _spec();
        sp.voteWindow = factory.MIN_WINDOW();
        sp.appealWindow = factory.MIN_WINDOW();
        sp.voterSlash = MIN_VALIDATOR;
        sp.absentPenalty = MIN_VALIDATOR / factory.ABSENT_PENALTY_DIVISOR();
    }

    function _attackerHoldings(TrainingJob job) internal view returns (uint256) {
        return _wealth(job, requester) + _wealth(job, aWorker) + _wealth(job, aValidator);
    }

    function test_absencePenaltiesOnValidatorsThatNeverEnlistedAllRevert() public {
        // v1 and v2 follow an honest job; enlisting there says nothing about the attacker's job.
        vm.prank(outsider);
        TrainingJob honestJob = TrainingJob(payable(factory.createJob{value: BUDGET}(_spec())));
        _enlist(honestJob, v1);
        _enlist(honestJob, v2);
        uint256[3] memory hBefore = [_holdings(v1), _holdings(v2), _holdings(v3)];
        uint256 attackerBefore = _holdings(requester) + _holdings(aWorker) + _holdings(aValidator);

        // Nothing shorter or harsher is accepted.
        JobSpec memory worse = _evilSpec();
        worse.voteWindow -= 1;
        vm.expectRevert(_invalid("voteWindow"));
        factory.validateSpec(worse);
        worse = _evilSpec();
        worse.appealWindow -= 1;
        vm.expectRevert(_invalid("appealWindow"));
        factory.validateSpec(worse);
        worse = _evilSpec();
        worse.absentPenalty += 1;
        vm.expectRevert(_invalid("absentPenalty"));
        factory.validateSpec(worse);

        JobSpec memory sp = _evilSpec();
        TrainingJob job = _createJob(sp, BUDGET);
        _enlist(job, aValidator); // only the attacker's own validator follows its job
        _roll(1);

        uint256 attempts;
        for (uint256 n = 0; n < 2; ++n) {
            uint256 id = _submitted(job, aWorker, 0);
            for (uint256 r = 0; r <= sp.appealRounds; ++r) {
                if (job.memberWeight(id, r, aValidator) > 0) _vote(job, aValidator, id, true);
                assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Voting), "no majority: still open");
                vm.warp(uint256(_deadline(job, id)) + 1); // the round runs to its deadline
                for (uint256 i = 0; i < 3; ++i) {
                    if (job.memberWeight(id, r, honest[i]) == 0) continue; // not drawn
                    ++attempts;
                    vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, honest[i]));
                    vm.prank(requester);
                    job.penalizeAbsent(id, r, honest[i]);
                }
                if (r < sp.appealRounds) _appeal(job, aValidator, id);
            }
            assertEq(uint256(job.getLease(id).round), sp.appealRounds, "ran to the final round");
            job.finalize(id);
            for (uint256 i = 0; i < 3; ++i) {
                vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, honest[i]));
                job.penalizeAbsent(id, sp.appealRounds, honest[i]); // the final round seated them all
            }
            _cashOut(job, id, aWorker);
            _cashOut(job, id, aValidator);
        }
        assertGe(attempts, 6, "every honest validator was drawn into both final rounds");
        vm.prank(requester);
        job.close();

        for (uint256 i = 0; i < 3; ++i) {
            assertEq(_loss(hBefore[i], _wealth(job, honest[i])), 0, "honest validator loses nothing");
            assertEq(_wealth(job, honest[i]), hBefore[i], "and is untouched");
        }
        int256 gain = _gain(attackerBefore, _attackerHoldings(job));
        assertLtInt(gain, 1, "the attacker gains from farming absence penalties");
        assertEq(uint256(-gain), job.burned() + job.poolHeld(), "it loses exactly the burn (and dust) of its bonds");
        assertEq(address(job).balance, job.burned() + job.poolHeld(), "no honest wei in the attacker's job");
        _solvent(job);
    }
}

// ======================================================================================================
// (10) A cheating worker launders its locked collateral through an accomplice's job.
// ======================================================================================================

/// @title Attack10_CollateralLaunderingTest
/// @notice A cheating worker wants its locked collateral out before its rejected lease settles. With a shared
///         stake it would also validate, and an accomplice's job with tiny windows would take that stake as
///         absence penalties (a slash reaches locked stake last) for the accomplice's validator. An address
///         holds one staked role: the cheater cannot be a validator, so in the accomplice's job it is never
///         drawn, cannot enlist, cannot be penalized or slashed, and its own lease there takes only that
///         lease's collateral. The honest job's rejected lease takes its collateral in full.
contract Attack10_CollateralLaunderingTest is AttackBase {
    address internal cheat;
    address internal acc;
    address internal accWorker;
    address internal accValidator;
    address[3] internal honest;
    JobSpec internal s;
    TrainingJob internal job;

    function setUp() public {
        _start();
        cheat = makeAddr("cheatWorker");
        acc = makeAddr("accomplice");
        accWorker = makeAddr("accompliceWorker");
        accValidator = makeAddr("accompliceValidator");
        address[4] memory group = [cheat, acc, accWorker, accValidator];
        for (uint256 i = 0; i < 4; ++i) {
            vm.deal(group[i], 100 ether);
        }
        _join(v1, VALIDATOR, 5 ether);
        _join(v2, VALIDATOR, 5 ether);
        _join(v3, VALIDATOR, 5 ether);
        _join(accWorker, WORKER, 5 ether);
        _join(accValidator, VALIDATOR, MIN_VALIDATOR); // W = 17
        _roll(1);
        honest = [v1, v2, v3];
        s = _spec();
        s.committeeSize = 4; // W = 17: 4 * 5 >= 17, every honest validator sits with its own weight
        job = _createJob(s, BUDGET);
        for (uint256 i = 0; i < 3; ++i) {
            _enlist(job, honest[i]); // the honest validators follow the honest job
        }
    }

    function _groupHoldings() internal view returns (uint256) {
        return _holdings(cheat) + _holdings(acc) + _holdings(accWorker) + _holdings(accValidator);
    }

    function test_cheaterCannotValidate_andItsRejectedCollateralIsTakenInFull() public {
        // (a) The cheater cannot hold the validator role next to its worker stake.
        uint256 key = _peerKey(cheat);
        bytes memory pid = _peerIdOf(key);
        bytes memory sig = _peerSig(registry, key, cheat);
        uint8[2] memory dual = [BOTH, BOTH | TRAINER_ROLE];
        for (uint256 i = 0; i < 2; ++i) {
            vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, dual[i]));
            vm.prank(cheat);
            registry.join{value: 2 ether}(pid, sig, dual[i]);
        }
        _join(cheat, WORKER, 2 ether);
        _roll(1);
        uint256 groupBefore = _groupHoldings();
        uint256[3] memory hBefore = [_holdings(v1), _holdings(v2), _holdings(v3)];
        uint256 reqBefore = _holdings(requester) + BUDGET;

        // (b) Its garbage batch in the honest job is rejected early; the collateral stays locked for a day.
        uint256 id = _submitted(job, cheat, 0);
        assertEq(_locked(cheat), s.slashAmount, "collateral locked");
        assertEq(job.memberWeight(id, 0, cheat), 0, "a worker sits on no committee");
        _vote(job, v1, id, false);
        _vote(job, v2, id, false); // 10 of 17: decided early
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Decided), "decided");
        assertEq(uint256(_outcome(job, id)), uint256(TrainingJob.Outcome.Reject), "rejected");

        // (c) Meanwhile the accomplice's job runs: shortest windows, harshest penalties, everyone seated.
        JobSpec memory as_ = _spec();
        as_.committeeSize = 64; // 64 * 2 >= 17: every validator sits with its own weight
        as_.voteWindow = factory.MIN_WINDOW();
        as_.appealWindow = factory.MIN_WINDOW();
        as_.slashAmount = MIN_WORKER;
        as_.voterSlash = MIN_VALIDATOR;
        as_.absentPenalty = MIN_VALIDATOR / factory.ABSENT_PENALTY_DIVISOR();
        vm.prank(acc);
        TrainingJob accJob = TrainingJob(payable(factory.createJob{value: BUDGET}(as_)));
        _enlist(accJob, accValidator);
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotActive.selector, cheat, VALIDATOR));
        vm.prank(cheat);
        accJob.enlist();
        _roll(1);

        uint256 a1 = _submitted(accJob, accWorker, 0);
        // The cheater launders its free stake through a lease of its own there, rejected by the accomplice.
        uint256 a2 = _submitted(accJob, cheat, 0);
        assertEq(_locked(cheat), s.slashAmount + as_.slashAmount, "both collaterals locked");
        assertEq(accJob.memberWeight(a1, 0, cheat), 0, "the cheater sits on no committee");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotInCommittee.selector, a1, 0, cheat));
        vm.prank(cheat);
        accJob.vote(a1, false);
        _vote(accJob, accValidator, a1, false);
        _vote(accJob, accValidator, a2, false);
        vm.warp(uint256(_deadline(accJob, a2)) + 1); // both rounds ran to their deadlines: 2 of 17 reject
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, cheat));
        vm.prank(acc);
        accJob.penalizeAbsent(a1, 0, cheat);
        for (uint256 i = 0; i < 3; ++i) {
            vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotEnlisted.selector, honest[i]));
            vm.prank(acc);
            accJob.penalizeAbsent(a1, 0, honest[i]);
        }
        vm.warp(block.timestamp + as_.appealWindow);
        accJob.finalize(a1);
        accJob.finalize(a2);
        assertEq(uint256(_status(accJob, a2)), uint256(TrainingJob.Status.Slashed), "its own lease there rejected");
        vm.expectRevert(abi.encodeWithSelector(TrainingJob.NotSlashable.selector, a1, cheat));
        accJob.slashLoser(a1, cheat);
        assertEq(_locked(cheat), s.slashAmount, "the honest lease's collateral is still locked in full");
        _cashOut(accJob, a1, accValidator);
        _cashOut(accJob, a2, accValidator);
        vm.prank(acc);
        accJob.close();

        // (d) The honest job settles: the collateral is taken in full, for the honest winners.
        vm.warp(uint256(_deadline(job, id)) + 1);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Slashed), "slashed");
        (, uint128 voterPool,) = job.disputes(id);
        assertEq(uint256(voterPool) + job.burned(), s.slashAmount, "the rejected lease's collateral taken in full");
        assertEq(_locked(cheat), 0, "nothing left locked");
        assertEq(_active(cheat), 2 ether - s.slashAmount - as_.slashAmount, "both collaterals gone");
        for (uint256 i = 0; i < 3; ++i) {
            _cashOut(job, id, honest[i]);
        }
        vm.prank(requester);
        job.close();

        int256 gain = _gain(groupBefore, _groupHoldings());
        assertLtInt(gain, 1, "the cheater and its accomplices gain");
        assertGe(uint256(-gain), s.slashAmount, "the group loses at least the honest job's collateral");
        for (uint256 i = 0; i < 3; ++i) {
            assertEq(_loss(hBefore[i], _holdings(honest[i])), 0, "honest validator loses nothing");
        }
        assertEq(_loss(reqBefore, _holdings(requester)), 0, "honest requester loses nothing");
        _solvent(job);
        _solvent(accJob);
    }
}
