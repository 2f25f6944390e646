// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Fixture} from "./Fixture.sol";
import {Vm, FuzzSelector} from "./TestBase.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {JobSpec} from "../src/Interfaces.sol";

/// @notice The one cheatcode this suite needs beyond TestBase's `Vm` (exact forge 1.7.1 signature), used only
///         by the scripted test to fix a round's committee randomness.
interface InvariantVm {
    function setBlockhash(uint256 blockNumber, bytes32 blockHash) external;
}

/// @notice Who is who in the invariant campaign.
struct Cast {
    address[] honestValidators;
    address[] colluders;
    address[] honestWorkers;
    address cheater;
    /// @dev The cheater's own validator: a separate address (an address holds one staked role) that colludes.
    address cheaterValidator;
    address hoarder;
    address griefer;
    address keeper;
}

/// @title InvariantHandler
/// @notice Random calls from many actors against one registry and one job. Honest actors follow the
///         protocol: honest workers draw their seed and submit good batches before their lease expires,
///         honest validators vote the truth in every round they sit on before its deadline, and an honest
///         validator appeals every current decision that contradicts the truth while rounds remain. This is
///         enforced by `warp` and `roll` (and every other action that moves time): before time passes any
///         lease, vote or appeal deadline (or the chain passes a 256-block randomness horizon) every honest
///         duty that is due is done. Colluders vote the lie, the griefer appeals correct decisions, the
///         cheater submits bad batches (and appeals their rejection), the hoarder claims and lets leases
///         expire; keepers settle, reclaim, slash losers, penalize absentees and draw randomness.
///         Honest validators enlist in the job at the start (so they answer for absence and must never be
///         absent); each colluder, the cheater's own validator among them, may enlist or delist at any time,
///         or never. The cheater is a worker only; its separate validator address votes with the colluders.
///         A careful keeper penalizes only members the handler's own ghost book says were enlisted at the
///         round's start; a reckless one tries any member, and a penalty on anyone else is counted.
/// @dev Ground truth per lease: an honest worker's batch is good (Accept), the cheater's bad (Reject).
///      Ghost state: per-lease last status/round/deadline (every job call on a lease is followed by `_track`,
///      and every action ends with a scan of all leases), how often each lease reached a terminal status,
///      and coverage counters. Honest-duty calls that revert are counted in `ghostDutyFailures`.
contract InvariantHandler {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    uint8 internal constant WORKER = 1;
    uint8 internal constant VALIDATOR = 2;
    uint256 internal constant LOSER_BIT = 1 << 16;
    uint256 internal constant ABSENT_BITS = 8;

    NodeRegistry public immutable registry;
    TrainingJob public immutable job;
    address public immutable trainer;
    address public immutable requester;
    address public immutable keeper;
    address public immutable cheater;
    address public immutable cheaterValidator;
    address public immutable hoarder;
    address public immutable griefer;
    uint256 public immutable leaseCost;
    uint256 public immutable budget;
    /// @notice The requester's wallet right after funding the job.
    uint256 public immutable requesterStart;
    uint256 internal immutable appealRounds;
    uint256 internal immutable appealWindow;
    uint256 internal immutable slashAmount;
    uint256 internal immutable maxStaleness;
    uint256 internal immutable minValidator;
    uint256 internal immutable expiryFee;
    uint256 internal immutable voterSlash;
    uint256 internal immutable absentPenalty;

    address[] public honestValidators;
    address[] public colluders;
    address[] public honestWorkers;
    /// @notice Every node with the validator role: the honest ones, then the colluders.
    address[] public validators;
    /// @notice Every staked node: honest validators, colluders, honest workers, cheater, hoarder, griefer.
    address[] public actors;
    mapping(address => uint256) public startWealth;
    mapping(address => bool) public isHonestWorker;
    mapping(address => bool) public isHonestValidator;
    mapping(address => bool) public isColluder;

    // ------------------------------------------------------------------ ghost state per lease
    mapping(uint256 => TrainingJob.Status) public lastStatus;
    mapping(uint256 => uint8) public lastRound;
    mapping(uint256 => uint64) public lastDeadline;
    /// @notice How many times a lease went from open (Leased/Voting/Decided) to Paid/Slashed/Returned/Lapsed.
    mapping(uint256 => uint256) public settleCount;
    /// @notice Leases open when the scripted `outage` let time pass without honest duties.
    mapping(uint256 => bool) public excused;
    uint256[] internal openLeases;
    uint256 internal appellantTurn;
    /// @notice Odds (x/4) that a colluder drawn into a round votes the lie as soon as it can (0: only when
    ///         the fuzzer calls voteColluder).
    uint256 public colluderEagerness = 2;

    // ------------------------------------------------------------------ ghost counters
    uint256 public ghostClaims;
    uint256 public ghostSeeds;
    uint256 public ghostSubmits;
    uint256 public ghostCommitteesDrawn;
    uint256 public ghostVotes;
    uint256 public ghostHonestVotes;
    uint256 public ghostColluderVotes;
    uint256 public ghostEarlyDecisions;
    uint256 public ghostLateCloses;
    uint256 public ghostAppeals;
    uint256 public ghostHonestAppeals;
    uint256 public ghostGrieferAppeals;
    uint256 public ghostCheaterAppeals;
    uint256 public ghostAppealsWon;
    uint256 public ghostAppealsLost;
    uint256 public ghostPaid;
    uint256 public ghostSlashed;
    uint256 public ghostLapsed;
    uint256 public ghostReturned;
    uint256 public ghostLosersSlashed;
    uint256 public ghostAbsentPenalized;
    /// @notice penalizeAbsent calls refused with NotEnlisted.
    uint256 public ghostNotEnlistedRefusals;
    uint256 public ghostEnlists;
    uint256 public ghostDelists;
    /// @notice A member penalized as absent in a round it was not enlisted for (by the ghost book below).
    uint256 public ghostUnenlistedPunished;
    /// @notice The handler's own record of every enlist and delist (block numbers; 0: never).
    mapping(address => uint256) public ghostEnlistedAt;
    mapping(address => uint256) public ghostDelistedAt;
    uint256 public ghostRewardsClaimed;
    uint256 public ghostWithdrawals;
    uint256 public ghostStakeWithdrawals;
    uint256 public ghostPolicies;
    uint256 public ghostCloses;
    uint256 public ghostKeeperMisses;
    /// @notice Expiry fees the rules take from Returned leases (capped at the collateral still locked).
    uint256 public ghostFeesDue;
    /// @notice Wei credited to workers by settlements that paid them.
    uint256 public ghostWorkerPay;
    /// @notice Honest-duty calls that reverted, or an honest lease/round left without a way to act.
    uint256 public ghostDutyFailures;
    string public lastDutyFailure;
    /// @notice Calls whose preconditions the handler checked that reverted anyway.
    uint256 public ghostUnexpectedReverts;
    string public lastUnexpected;
    /// @notice Settled submitted leases (not excused) whose final outcome contradicts the truth.
    uint256 public ghostWrongFinal;
    /// @notice Drawn rounds whose seats break the committee rule (checked once per round): the final round
    ///         seats every validator but the worker with its snapshot weight; an earlier round seats a
    ///         validator with weight w (k * w >= W), W / k (drawn) or not at all; the round's total is the
    ///         registry's total at the block before its start.
    uint256 public ghostSeatViolations;
    uint256 public ghostSeatChecks;
    uint256 public ghostFinalRounds;
    mapping(uint256 => mapping(uint256 => bool)) internal seatsChecked;
    /// @notice A lease whose terminal status later changed.
    uint256 public ghostTerminalRewrites;
    /// @notice An honest validator slashed as a loser or penalized as absent.
    uint256 public ghostHonestPunished;
    /// @notice What the rules took from each actor: collateral of its rejected leases and expiry fees of its
    ///         expired leases (capped at the collateral still locked then), bonds of its lost appeals, and
    ///         its loser slashes and absence penalties (capped at its stake then).
    mapping(address => uint256) public forfeit;
    uint256 internal lockedBeforeSettle;

    constructor(NodeRegistry registry_, TrainingJob job_, address requester_, uint256 budget_, Cast memory c) {
        registry = registry_;
        job = job_;
        JobSpec memory s = job_.spec();
        trainer = s.trainer;
        requester = requester_;
        keeper = c.keeper;
        cheater = c.cheater;
        cheaterValidator = c.cheaterValidator;
        hoarder = c.hoarder;
        griefer = c.griefer;
        leaseCost = job_.leaseCost();
        budget = budget_;
        requesterStart = requester_.balance;
        appealRounds = s.appealRounds;
        appealWindow = s.appealWindow;
        slashAmount = s.slashAmount;
        maxStaleness = s.maxStaleness;
        minValidator = registry_.minValidatorStake();
        expiryFee = s.expiryFee;
        voterSlash = s.voterSlash;
        absentPenalty = s.absentPenalty;
        for (uint256 i = 0; i < c.honestValidators.length; ++i) {
            honestValidators.push(c.honestValidators[i]);
            isHonestValidator[c.honestValidators[i]] = true;
            actors.push(c.honestValidators[i]);
        }
        for (uint256 i = 0; i < c.colluders.length; ++i) {
            colluders.push(c.colluders[i]);
            isColluder[c.colluders[i]] = true;
            actors.push(c.colluders[i]);
        }
        for (uint256 i = 0; i < c.honestWorkers.length; ++i) {
            honestWorkers.push(c.honestWorkers[i]);
            isHonestWorker[c.honestWorkers[i]] = true;
            actors.push(c.honestWorkers[i]);
        }
        actors.push(c.cheater);
        actors.push(c.hoarder);
        actors.push(c.griefer);
        // The cheater's validator colludes: it votes the lie on every batch, its partner's included.
        colluders.push(c.cheaterValidator);
        isColluder[c.cheaterValidator] = true;
        actors.push(c.cheaterValidator);
        for (uint256 i = 0; i < honestValidators.length; ++i) {
            validators.push(honestValidators[i]);
            // Honest validators follow the job: they enlist before any round starts.
            vm.prank(honestValidators[i]);
            job_.enlist();
            ghostEnlistedAt[honestValidators[i]] = block.number;
        }
        for (uint256 i = 0; i < colluders.length; ++i) {
            validators.push(colluders[i]);
        }
        for (uint256 i = 0; i < actors.length; ++i) {
            startWealth[actors[i]] = _stakeAndWallet(actors[i]);
        }
    }

    modifier action() {
        _;
        _syncAll();
    }

    // ================================================================== views for the invariants

    /// @notice 1: honest validator, 2: honest worker, 3: adversary (colluder, cheater, hoarder, griefer).
    function kindOf(address a) external view returns (uint256) {
        if (isHonestValidator[a]) return 1;
        if (isHonestWorker[a]) return 2;
        return 3;
    }

    function actorCount() external view returns (uint256) {
        return actors.length;
    }

    function honestValidatorCount() external view returns (uint256) {
        return honestValidators.length;
    }

    function colluderCount() external view returns (uint256) {
        return colluders.length;
    }

    function honestWorkerCount() external view returns (uint256) {
        return honestWorkers.length;
    }

    /// @notice The ground truth of a lease by its worker: Accept (honest), Reject (cheater), else Pending.
    function truthOf(address worker) public view returns (TrainingJob.Outcome) {
        if (isHonestWorker[worker]) return TrainingJob.Outcome.Accept;
        if (worker == cheater) return TrainingJob.Outcome.Reject;
        return TrainingJob.Outcome.Pending;
    }

    /// @notice Everything each actor holds in the market, in `actors` order: wallet, stake in every registry
    ///         bucket, what the job owes it, its appeal bonds still held on open leases, and its dispute rewards
    ///         not yet credited (rewardOf - rewardClaimed).
    function wealths() external view returns (uint256[] memory w) {
        uint256 n = actors.length;
        w = new uint256[](n);
        for (uint256 i = 0; i < n; ++i) {
            w[i] = _stakeAndWallet(actors[i]) + job.owed(actors[i]);
        }
        uint256 count = job.leaseCount();
        for (uint256 id = 1; id <= count; ++id) {
            TrainingJob.Lease memory l = job.getLease(id);
            if (_open(l.status)) {
                for (uint256 r = 1; r <= l.round; ++r) {
                    address a = job.appellants(id, r);
                    uint256 bond = job.appealBondFor(r);
                    for (uint256 i = 0; i < n; ++i) {
                        if (actors[i] == a) w[i] += bond;
                    }
                }
            } else if (_poolsOf(id) > 0) {
                for (uint256 i = 0; i < n; ++i) {
                    // Checked: a claimed reward above the entitlement makes the invariant revert (fail).
                    if (_tookPart(id, l.round, actors[i])) {
                        w[i] += job.rewardOf(id, actors[i]) - job.rewardClaimed(id, actors[i]);
                    }
                }
            }
        }
    }

    /// @notice Per actor (in `actors` order), the collateral its open leases should hold locked.
    function expectedLocked() external view returns (uint256[] memory locked) {
        uint256 n = actors.length;
        locked = new uint256[](n);
        uint256 count = job.leaseCount();
        for (uint256 id = 1; id <= count; ++id) {
            TrainingJob.Lease memory l = job.getLease(id);
            if (!_open(l.status)) continue;
            for (uint256 i = 0; i < n; ++i) {
                if (actors[i] == l.worker) locked[i] += slashAmount;
            }
        }
    }

    /// @notice Over settled leases with pools: the most the actors' entitlements fall short of the pools
    ///         (rounding dust) and whether they ever exceed them.
    function rewardSums() external view returns (uint256 maxShortfall, bool exceeded) {
        uint256 count = job.leaseCount();
        for (uint256 id = 1; id <= count; ++id) {
            if (_open(job.getLease(id).status)) continue;
            uint256 pools = _poolsOf(id);
            if (pools == 0) continue;
            uint256 entitled;
            uint256 round = job.getLease(id).round;
            for (uint256 i = 0; i < actors.length; ++i) {
                if (_tookPart(id, round, actors[i])) entitled += job.rewardOf(id, actors[i]);
            }
            if (entitled > pools) exceeded = true;
            else if (pools - entitled > maxShortfall) maxShortfall = pools - entitled;
        }
    }

    /// @notice Sum of the appeal bonds of every open lease.
    function openBonds() external view returns (uint256 sum) {
        uint256 count = job.leaseCount();
        for (uint256 id = 1; id <= count; ++id) {
            TrainingJob.Lease memory l = job.getLease(id);
            if (!_open(l.status)) continue;
            for (uint256 r = 1; r <= l.round; ++r) {
                sum += job.appealBondFor(r);
            }
        }
    }

    /// @notice What poolHeld should be: every lease's pending wei and pools, less every reward claimed.
    function poolBook() external view returns (uint256 held, uint256 claimed) {
        uint256 count = job.leaseCount();
        for (uint256 id = 1; id <= count; ++id) {
            (uint128 pending, uint128 voterPool, uint128 appellantPool) = job.disputes(id);
            held += uint256(pending) + voterPool + appellantPool;
            if (uint256(voterPool) + appellantPool == 0) continue;
            for (uint256 i = 0; i < actors.length; ++i) {
                claimed += job.rewardClaimed(id, actors[i]);
            }
        }
    }

    /// @notice Per status, how many leases are in it now (index = uint(Status)).
    function statusCounts() external view returns (uint256[8] memory counts) {
        uint256 count = job.leaseCount();
        for (uint256 id = 1; id <= count; ++id) {
            ++counts[uint256(job.getLease(id).status)];
        }
    }

    // ================================================================== time

    /// @notice Let time pass (doing every honest duty before each deadline on the way).
    function warp(uint256 dt) external action {
        _advanceTo(block.timestamp + _bound(dt, 1, 36 hours));
    }

    /// @notice Mine blocks without time passing (honest duties first: seeds and committees drawn, votes cast).
    function roll(uint256 n) external action {
        _duties(false);
        vm.roll(block.number + _bound(n, 1, 300));
    }

    /// @notice Scripted only (not a fuzz target): time passes while every honest party is offline. Leases
    ///         open now are excused from the truth check.
    function outage(uint256 dt) external action {
        for (uint256 i = 0; i < openLeases.length; ++i) {
            excused[openLeases[i]] = true;
        }
        vm.warp(block.timestamp + dt);
    }

    // ================================================================== stake moves

    function addStake(uint256 who, uint256 amount) external action {
        address a = actors[who % actors.length];
        amount = _bound(amount, 1, 3 ether);
        if (isColluder[a]) {
            (,, uint256 active, uint256 locked,,) = registry.nodeInfo(a);
            (uint256 wOld,) = registry.currentWeights(a);
            uint256 wNew = active + locked + amount >= minValidator ? active + locked + amount : 0;
            (uint256 honestW, uint256 colluderW) = _sideWeights();
            if (2 * (colluderW + wNew - wOld) >= honestW) return; // the honest side keeps a 2/3 majority
        }
        vm.prank(a);
        try registry.addStake{value: amount}() {}
        catch {
            _unexpected("addStake");
        }
    }

    function requestUnbond(uint256 who, uint256 amount) external action {
        address a = actors[who % actors.length];
        (,, uint256 active, uint256 locked,,) = registry.nodeInfo(a);
        if (active == 0) return;
        amount = amount % 3 == 0 ? active : _bound(amount, 1, active);
        if (isHonestValidator[a]) {
            // Honest validators stay active validators and keep a 2/3 majority of validator weight.
            if (active + locked < minValidator + amount) return;
            (uint256 honestW, uint256 colluderW) = _sideWeights();
            if (2 * colluderW >= honestW - amount) return;
        }
        vm.prank(a);
        try registry.requestUnbond(amount) {}
        catch {
            _unexpected("requestUnbond");
        }
    }

    function withdraw(uint256 who, uint256 jump) external action {
        address a;
        uint64 readyAt;
        for (uint256 j = 0; j < actors.length && a == address(0); ++j) {
            address c = actors[(who % actors.length + j) % actors.length];
            (,,,, uint256 unbonding, uint64 ready) = registry.nodeInfo(c);
            if (unbonding > 0) (a, readyAt) = (c, ready);
        }
        if (a == address(0)) return;
        if (jump % 4 == 0 && block.timestamp < readyAt) _advanceTo(readyAt);
        if (block.timestamp < readyAt) return;
        vm.prank(a);
        try registry.withdraw() {
            ++ghostStakeWithdrawals;
        } catch {
            _unexpected("withdraw");
        }
    }

    // ================================================================== enlistment

    /// @notice A colluder (the cheater's validator included) enlists in the job, if it has not yet.
    function enlistColluder(uint256 who) external action {
        address c = colluders[who % colluders.length];
        if (ghostEnlistedAt[c] != 0 || !registry.isActive(c, VALIDATOR)) return;
        vm.prank(c);
        try job.enlist() {
            ++ghostEnlists;
            ghostEnlistedAt[c] = block.number;
        } catch {
            _unexpected("enlist");
        }
    }

    /// @notice An enlisted colluder leaves the job (final).
    function delistColluder(uint256 who) external action {
        address c = colluders[who % colluders.length];
        if (ghostEnlistedAt[c] == 0 || ghostDelistedAt[c] != 0) return;
        vm.prank(c);
        try job.delist() {
            ++ghostDelists;
            ghostDelistedAt[c] = block.number;
        } catch {
            _unexpected("delist");
        }
    }

    /// @notice By the ghost book: whether `v` was enlisted when a round starting at `start` took its snapshot.
    function ghostEnlistedFor(address v, uint256 start) public view returns (bool) {
        uint256 since = ghostEnlistedAt[v];
        uint256 left = ghostDelistedAt[v];
        return since != 0 && since < start && (left == 0 || left >= start);
    }

    // ================================================================== trainer and requester

    function publishPolicy() external action {
        uint64 v = job.currentVersion() + 1;
        vm.prank(trainer);
        try job.publishPolicy(v, keccak256(abi.encode("policy", v))) {
            ++ghostPolicies;
        } catch {
            _unexpected("publishPolicy");
        }
    }

    function close(uint256 seed) external action {
        if (seed % 8 != 0) return; // rarely: a closed job takes no new claims for the rest of the run
        uint256 before = requester.balance;
        vm.prank(requester);
        try job.close() {
            ++ghostCloses;
        } catch {
            _unexpected("close");
        }
        if (requester.balance < before) _unexpected("close cost the requester");
    }

    // ================================================================== workers

    function claimHonest(uint256 who) external action {
        _claimBy(honestWorkers[who % honestWorkers.length]);
    }

    function claimCheater() external action {
        _claimBy(cheater);
    }

    function claimHoarder() external action {
        _claimBy(hoarder);
    }

    /// @notice An honest worker submits a good batch early (its duty guarantees it happens before expiry).
    function submitHonest(uint256 leaseSeed) external action {
        uint256 id = _pick(leaseSeed, PICK_HONEST_SUBMITTABLE);
        if (id == 0) return;
        _submitBatch(id, job.getLease(id).worker, job.currentVersion());
    }

    /// @notice The cheater draws its seed if needed and submits a bad batch, at any admissible version.
    function submitCheater(uint256 leaseSeed, uint256 lag) external action {
        uint256 id = _pick(leaseSeed, PICK_CHEATER_LEASED);
        if (id == 0) return;
        TrainingJob.Lease memory l = job.getLease(id);
        if (l.seed == 0) {
            if (block.number <= l.anchorBlock || blockhash(l.anchorBlock) == 0) return;
            _drawSeed(id);
        }
        uint64 current = job.currentVersion();
        uint256 maxLag = maxStaleness < current ? maxStaleness : current;
        _submitBatch(id, cheater, current - uint64(_bound(lag, 0, maxLag)));
    }

    // ================================================================== validators and appellants

    function voteHonest(uint256 leaseSeed, uint256 who) external action {
        uint256 id = _pick(leaseSeed, PICK_VOTING);
        if (id == 0) return;
        address v = _pickMember(id, honestValidators, who);
        if (v == address(0)) return;
        _castVote(v, id, truthOf(job.getLease(id).worker) == TrainingJob.Outcome.Accept, true);
    }

    /// @notice An honest validator votes on every open lease at once (voteBatch skips where it is no member).
    function voteBatchHonest(uint256 who) external action {
        address v = honestValidators[who % honestValidators.length];
        uint256 n;
        uint256[] memory ids = new uint256[](openLeases.length);
        bool[] memory accepts = new bool[](openLeases.length);
        for (uint256 i = 0; i < openLeases.length; ++i) {
            uint256 id = openLeases[i];
            TrainingJob.Lease memory l = job.getLease(id);
            if (!_votable(id, l)) continue;
            ids[n] = id;
            accepts[n] = truthOf(l.worker) == TrainingJob.Outcome.Accept;
            ++n;
        }
        if (n == 0) return;
        assembly {
            mstore(ids, n)
            mstore(accepts, n)
        }
        uint256[] memory before = new uint256[](n);
        for (uint256 i = 0; i < n; ++i) {
            before[i] = job.ballots(ids[i], v);
        }
        vm.prank(v);
        try job.voteBatch(ids, accepts) {
            for (uint256 i = 0; i < n; ++i) {
                if (job.ballots(ids[i], v) != before[i]) {
                    ++ghostVotes;
                    ++ghostHonestVotes;
                }
                _track(ids[i]);
            }
        } catch (bytes memory reason) {
            _fail("voteBatch reverted", reason);
        }
    }

    /// @notice A colluder votes the lie on one lease it sits on, or (leaseSeed odd) the colluders vote the
    ///         lie on every open lease where they sit.
    function voteColluder(uint256 leaseSeed, uint256 who) external action {
        if (leaseSeed % 2 == 1) {
            for (uint256 i = 0; i < openLeases.length; ++i) {
                _colludeOn(openLeases[i], who);
            }
            return;
        }
        uint256 id = _pick(leaseSeed, PICK_VOTING);
        if (id != 0) _colludeOn(id, who);
    }

    function _colludeOn(uint256 id, uint256 who) internal {
        if (!_votable(id, job.getLease(id))) return;
        address v = _pickMember(id, colluders, who);
        if (v == address(0)) return;
        _castVote(v, id, truthOf(job.getLease(id).worker) != TrainingJob.Outcome.Accept, false);
    }

    /// @notice How eager the colluders are to vote (0..4 of 4).
    function setColluderEagerness(uint256 x) external action {
        colluderEagerness = x % 5;
    }

    /// @notice An honest validator appeals a current decision that contradicts the truth.
    function appealHonest(uint256 leaseSeed) external action {
        uint256 id = _pick(leaseSeed, PICK_APPEAL_WRONG);
        if (id == 0) return;
        _appealBy(_honestAppellant(), id, 1);
    }

    /// @notice The griefer appeals a current decision that matches the truth.
    function appealGriefer(uint256 leaseSeed) external action {
        uint256 id = _pick(leaseSeed, PICK_APPEAL_RIGHT);
        if (id == 0) return;
        _appealBy(griefer, id, 2);
    }

    /// @notice The cheater appeals the (correct) rejection of its own bad batch.
    function appealCheater(uint256 leaseSeed) external action {
        uint256 id = _pick(leaseSeed, PICK_CHEATER_APPEAL);
        if (id == 0) return;
        _appealBy(cheater, id, 3);
    }

    // ================================================================== keepers

    function drawSeed(uint256 leaseSeed) external action {
        uint256 id = _pick(leaseSeed, PICK_SEEDABLE);
        if (id == 0) return;
        _drawSeed(id);
    }

    function drawCommittee(uint256 leaseSeed) external action {
        uint256 id = _pick(leaseSeed, PICK_COMMITTEE_DRAWABLE);
        if (id == 0) return;
        _drawCommittee(id);
    }

    /// @notice Settle a lease; with `jump` even, first let time pass to where it can be settled.
    function finalize(uint256 leaseSeed, uint256 jump) external action {
        uint256 id = _pick(leaseSeed, PICK_DECIDING);
        if (id == 0) return;
        TrainingJob.Lease memory l = job.getLease(id);
        if (jump % 2 == 0 && l.status == TrainingJob.Status.Voting && block.timestamp <= l.deadline) {
            _advanceTo(uint256(l.deadline) + 1);
            l = job.getLease(id);
        }
        if (jump % 2 == 0 && _decidedNow(l) && !_finalizable(l)) {
            _advanceTo(_appealDeadline(l) + 1);
            l = job.getLease(id);
        }
        if (!_decidedNow(l) || !_finalizable(l)) return;
        uint256 owedBefore = job.owed(l.worker);
        _stashLocked(l.worker);
        vm.prank(keeper);
        try job.finalize(id) {
            _track(id);
            if (job.getLease(id).status == TrainingJob.Status.Paid) ghostWorkerPay += job.owed(l.worker) - owedBefore;
        } catch {
            ++ghostKeeperMisses;
            return;
        }
        if (jump % 3 == 0) _sweep(id); // a keeper bot slashes the losers and absentees right away
    }

    /// @notice A reckless keeper finalizes and reclaims a settled lease (any lease if none is settled): a
    ///         second settlement must revert, and one that does not is counted (and paid) like any other.
    function recklessSettle(uint256 leaseSeed) external action {
        uint256 count = job.leaseCount();
        if (count == 0) return;
        uint256 id = _pick(leaseSeed, PICK_SETTLED);
        if (id == 0) id = 1 + leaseSeed % count;
        address w = job.getLease(id).worker;
        uint256 owedBefore = job.owed(w);
        _stashLocked(w);
        vm.prank(keeper);
        try job.finalize(id) {
            _track(id);
            if (job.getLease(id).status == TrainingJob.Status.Paid) ghostWorkerPay += job.owed(w) - owedBefore;
        } catch {
            ++ghostKeeperMisses;
        }
        _stashLocked(w);
        vm.prank(keeper);
        try job.reclaim(id) {
            _track(id);
        } catch {
            ++ghostKeeperMisses;
        }
    }

    /// @dev Slash every loser of a settled lease and penalize every absent member of its closed rounds.
    function _sweep(uint256 id) internal {
        TrainingJob.Lease memory l = job.getLease(id);
        uint256 n = validators.length;
        bool decisive = l.status == TrainingJob.Status.Paid || l.status == TrainingJob.Status.Slashed;
        for (uint256 j = 0; decisive && j < n; ++j) {
            address v = _pickLoser(id, l, j);
            if (v == address(0)) break;
            _slashLoserOf(id, v);
        }
        for (uint256 r = 0; r <= l.round; ++r) {
            if (_roundMajority(id, r)) continue;
            for (uint256 j = 0; j < n; ++j) {
                address m = _pickAbsent(id, r, j, false);
                if (m == address(0)) break;
                _penalize(id, r, m);
            }
        }
    }

    function _slashLoserOf(uint256 id, address v) internal {
        uint256 due = _capped(v, voterSlash);
        vm.prank(keeper);
        try job.slashLoser(id, v) {
            forfeit[v] += due;
            ++ghostLosersSlashed;
            if (isHonestValidator[v]) ++ghostHonestPunished;
            _track(id);
        } catch {
            ++ghostKeeperMisses;
        }
    }

    function _penalize(uint256 id, uint256 r, address m) internal {
        uint256 due = _capped(m, absentPenalty);
        bool enlisted = ghostEnlistedFor(m, _start(id, r));
        vm.prank(keeper);
        try job.penalizeAbsent(id, r, m) {
            forfeit[m] += due;
            ++ghostAbsentPenalized;
            if (isHonestValidator[m]) ++ghostHonestPunished;
            if (!enlisted) ++ghostUnenlistedPunished;
            _track(id);
        } catch (bytes memory reason) {
            ++ghostKeeperMisses;
            if (reason.length >= 4 && bytes4(reason) == TrainingJob.NotEnlisted.selector) {
                ++ghostNotEnlistedRefusals;
                if (enlisted) _unexpected("penalizeAbsent refused an enlisted member as NotEnlisted");
            }
        }
    }

    /// @notice Reclaim an expired lease; with `jump` even, first let it expire (honest duties on the way).
    function reclaim(uint256 leaseSeed, uint256 jump) external action {
        uint256 id = _pick(leaseSeed, PICK_LEASED);
        if (id == 0) return;
        uint64 deadline = job.getLease(id).deadline;
        if (jump % 2 == 0 && block.timestamp <= deadline) _advanceTo(uint256(deadline) + 1);
        if (job.getLease(id).status != TrainingJob.Status.Leased || block.timestamp <= deadline) return;
        _stashLocked(job.getLease(id).worker);
        vm.prank(keeper);
        try job.reclaim(id) {
            _track(id);
        } catch {
            ++ghostKeeperMisses;
        }
    }

    function slashLoser(uint256 leaseSeed, uint256 who) external action {
        uint256 count = job.leaseCount();
        for (uint256 k = 0; k < count; ++k) {
            uint256 id = 1 + ((leaseSeed % count + k) % count);
            TrainingJob.Lease memory l = job.getLease(id);
            if (l.status != TrainingJob.Status.Paid && l.status != TrainingJob.Status.Slashed) continue;
            // Half the time a reckless keeper tries any voter, winners included (it must revert for them).
            address v = who % 2 == 0 ? _pickVoter(id, who / 2) : _pickLoser(id, l, who);
            if (v == address(0)) continue;
            _slashLoserOf(id, v);
            return;
        }
    }

    function penalizeAbsent(uint256 leaseSeed, uint256 who) external action {
        uint256 count = job.leaseCount();
        for (uint256 k = 0; k < count; ++k) {
            uint256 id = 1 + ((leaseSeed % count + k) % count);
            TrainingJob.Lease memory l = job.getLease(id);
            // Returned (never-submitted) leases are tried too: they have no rounds, so this must revert.
            if (l.status < TrainingJob.Status.Voting) continue;
            for (uint256 r = 0; r <= l.round; ++r) {
                // Half the time a reckless keeper also tries members of rounds a majority decided early, and
                // (independently) half the time any member: voters, the already penalized, the unenlisted.
                if (!_roundClosed(l, r) || (who % 2 == 1 && _roundMajority(id, r))) continue;
                address m = _pickAbsent(id, r, who, (who / 2) % 2 == 1);
                if (m == address(0)) continue;
                _penalize(id, r, m);
                return;
            }
        }
    }

    function claimReward(uint256 leaseSeed, uint256 who) external action {
        uint256 count = job.leaseCount();
        for (uint256 k = 0; k < count; ++k) {
            uint256 id = 1 + ((leaseSeed % count + k) % count);
            if (_open(job.getLease(id).status) || _poolsOf(id) == 0) continue;
            for (uint256 j = 0; j < actors.length; ++j) {
                address a = actors[(who % actors.length + j) % actors.length];
                if (job.rewardOf(id, a) <= job.rewardClaimed(id, a)) continue;
                vm.prank(a);
                try job.claimReward(id) {
                    ++ghostRewardsClaimed;
                } catch {
                    _unexpected("claimReward");
                }
                return;
            }
        }
    }

    function withdrawPayment(uint256 who) external action {
        for (uint256 j = 0; j < actors.length; ++j) {
            address a = actors[(who % actors.length + j) % actors.length];
            if (job.owed(a) == 0) continue;
            uint256 amount = job.owed(a);
            uint256 before = a.balance;
            vm.prank(a);
            try job.withdrawPayment() {
                ++ghostWithdrawals;
                if (a.balance != before + amount) _unexpected("withdrawPayment paid a different amount");
            } catch {
                _unexpected("withdrawPayment");
            }
            return;
        }
    }

    // ================================================================== honest duties

    /// @dev Move time to `target`, stopping at every lease, vote and appeal deadline on the way to do the
    ///      honest duties due while that deadline has not passed.
    function _advanceTo(uint256 target) internal {
        _duties(true);
        for (uint256 i = 0; block.timestamp < target; ++i) {
            if (i == 512) {
                _fail("advance: too many steps", "");
                vm.warp(target);
                vm.roll(block.number + 1);
                return;
            }
            vm.warp(_nextBoundary(target));
            vm.roll(block.number + 1); // time does not pass within one block
            _duties(true);
        }
    }

    /// @dev The earliest deadline of an open lease after now (a vote deadline also implies the appeal
    ///      deadline of a round that closes at it), or `target`.
    function _nextBoundary(uint256 target) internal view returns (uint256 next) {
        next = target;
        for (uint256 i = 0; i < openLeases.length; ++i) {
            TrainingJob.Lease memory l = job.getLease(openLeases[i]);
            if (!_open(l.status)) continue;
            uint256 d = l.deadline;
            if (d > block.timestamp && d < next) next = d;
            if (l.status == TrainingJob.Status.Voting && l.round < appealRounds) {
                d += appealWindow;
                if (d > block.timestamp && d < next) next = d;
            }
        }
    }

    /// @dev Every honest duty that can be done now; `timed` adds the ones that only time makes urgent
    ///      (submitting, appealing). Mines a block first when a seed or committee needs its block in the past.
    function _duties(bool timed) internal {
        for (uint256 pass = 0; pass < 16; ++pass) {
            if (_needsBlock()) vm.roll(block.number + 1);
            bool acted;
            for (uint256 i = 0; i < openLeases.length; ++i) {
                if (_dutyFor(openLeases[i], timed)) acted = true;
            }
            if (!acted) return;
        }
        _fail("duties: still acting after 16 passes", "");
    }

    function _needsBlock() internal view returns (bool) {
        for (uint256 i = 0; i < openLeases.length; ++i) {
            uint256 id = openLeases[i];
            TrainingJob.Lease memory l = job.getLease(id);
            if (l.status == TrainingJob.Status.Leased && l.seed == 0 && l.anchorBlock >= block.number) return true;
            if (l.status == TrainingJob.Status.Voting && _start(id, l.round) >= block.number) return true;
        }
        return false;
    }

    function _dutyFor(uint256 id, bool timed) internal returns (bool) {
        TrainingJob.Lease memory l = job.getLease(id);
        if (l.status == TrainingJob.Status.Leased) return _dutyLeased(id, l, timed);
        if (l.status == TrainingJob.Status.Voting && block.timestamp <= l.deadline) return _dutyVote(id, l);
        if (timed) return _dutyAppeal(id, l);
        return false;
    }

    function _dutyLeased(uint256 id, TrainingJob.Lease memory l, bool timed) internal returns (bool acted) {
        if (!isHonestWorker[l.worker]) return false;
        if (block.timestamp > l.deadline) {
            _fail("honest lease expired", "");
            return false;
        }
        if (l.seed == 0) {
            if (block.number <= l.anchorBlock) return false; // the next pass mines a block
            if (blockhash(l.anchorBlock) == 0) {
                _fail("honest seed lost", "");
                return false;
            }
            if (!_drawSeed(id)) return false;
            acted = true;
        }
        if (timed && _submitBatch(id, l.worker, job.currentVersion())) acted = true;
    }

    function _dutyVote(uint256 id, TrainingJob.Lease memory l) internal returns (bool acted) {
        uint256 start = _start(id, l.round);
        if (start >= block.number) return false; // the next pass mines a block
        (TrainingJob.Round memory rd,) = job.getRound(id, l.round);
        if (rd.seed == 0) {
            if (blockhash(start) == 0) {
                _fail("committee randomness lost", "");
                return false;
            }
            if (!_drawCommittee(id)) return false;
            acted = true;
        }
        _checkSeats(id, l, start);
        bool accept = truthOf(l.worker) == TrainingJob.Outcome.Accept;
        // Colluders are quicker: those drawn vote the lie first, each with odds colluderEagerness / 4.
        for (uint256 i = 0; i < colluders.length; ++i) {
            address c = colluders[i];
            if (uint256(keccak256(abi.encode(id, l.round, c))) % 4 >= colluderEagerness) continue;
            if (_hasVoted(id, l.round, c) || job.memberWeight(id, l.round, c) == 0) continue;
            if (_castVote(c, id, !accept, false)) acted = true;
            if (job.getLease(id).status != TrainingJob.Status.Voting) return acted;
        }
        for (uint256 i = 0; i < honestValidators.length; ++i) {
            address v = honestValidators[i];
            if (_hasVoted(id, l.round, v) || job.memberWeight(id, l.round, v) == 0) continue;
            if (_castVote(v, id, accept, true)) acted = true;
            if (job.getLease(id).status != TrainingJob.Status.Voting) break;
        }
    }

    /// @dev Check the committee rule for every validator of the lease's current (drawn) round, once.
    function _checkSeats(uint256 id, TrainingJob.Lease memory l, uint256 start) internal {
        uint256 r = l.round;
        if (seatsChecked[id][r]) return;
        seatsChecked[id][r] = true;
        ++ghostSeatChecks;
        if (r == appealRounds) ++ghostFinalRounds;
        (TrainingJob.Round memory rd,) = job.getRound(id, r);
        uint256 total = registry.totalValidatorWeightAt(start - 1);
        if (rd.totalWeight != total) ++ghostSeatViolations;
        uint256 k = r >= appealRounds ? type(uint256).max : job.committeeSizeOf(r);
        for (uint256 i = 0; i < validators.length; ++i) {
            address v = validators[i];
            (uint256 w,) = registry.weightsAt(v, start - 1);
            uint256 seat = job.memberWeight(id, r, v);
            bool ok;
            if (v == l.worker || w == 0) ok = seat == 0;
            else if (k == type(uint256).max || k * w >= total) ok = seat == w;
            else ok = seat == 0 || seat == total / k;
            if (!ok) ++ghostSeatViolations;
        }
    }

    function _dutyAppeal(uint256 id, TrainingJob.Lease memory l) internal returns (bool) {
        if (!_appealOpen(l) || job.outcomeOf(id) == truthOf(l.worker)) return false;
        return _appealBy(_honestAppellant(), id, 1);
    }

    // ================================================================== job calls (each tracked)

    function _claimBy(address w) internal {
        if (job.closed() || job.escrow() - job.reserved() < leaseCost) return;
        (,, uint256 active, uint256 locked,,) = registry.nodeInfo(w);
        if (active < slashAmount || active + locked < registry.minWorkerStake()) return;
        vm.prank(w);
        try job.claim() returns (uint256 id) {
            ++ghostClaims;
            openLeases.push(id);
            _track(id);
        } catch {
            _unexpected("claim");
        }
    }

    function _drawSeed(uint256 id) internal returns (bool) {
        vm.prank(keeper);
        try job.drawSeed(id) {
            ++ghostSeeds;
            _track(id);
            return true;
        } catch (bytes memory reason) {
            if (isHonestWorker[job.getLease(id).worker]) _fail("drawSeed reverted", reason);
            else ++ghostKeeperMisses;
            return false;
        }
    }

    function _drawCommittee(uint256 id) internal returns (bool) {
        vm.prank(keeper);
        try job.drawCommittee(id) {
            ++ghostCommitteesDrawn;
            _track(id);
            return true;
        } catch (bytes memory reason) {
            _fail("drawCommittee reverted", reason);
            return false;
        }
    }

    function _submitBatch(uint256 id, address w, uint64 version) internal returns (bool) {
        bytes32 root = keccak256(abi.encode(isHonestWorker[w] ? "good" : "bad", id));
        vm.prank(w);
        try job.submit(id, root, version) {
            ++ghostSubmits;
            _track(id);
            return true;
        } catch (bytes memory reason) {
            if (isHonestWorker[w]) _fail("submit reverted", reason);
            else ++ghostKeeperMisses;
            return false;
        }
    }

    function _castVote(address v, uint256 id, bool accept, bool honest) internal returns (bool) {
        vm.prank(v);
        try job.vote(id, accept) {
            ++ghostVotes;
            if (honest) ++ghostHonestVotes;
            else ++ghostColluderVotes;
            _track(id);
            return true;
        } catch (bytes memory reason) {
            if (honest) _fail("vote reverted", reason);
            else ++ghostKeeperMisses;
            return false;
        }
    }

    /// @dev kind: 1 honest, 2 griefer, 3 cheater.
    function _appealBy(address who, uint256 id, uint256 kind) internal returns (bool) {
        uint256 bond = job.appealBondFor(uint256(job.getLease(id).round) + 1);
        if (who.balance < bond) {
            if (kind == 1) _fail("honest appellant cannot pay the bond", "");
            return false;
        }
        vm.prank(who);
        try job.appeal{value: bond}(id) {
            ++ghostAppeals;
            if (kind == 1) ++ghostHonestAppeals;
            else if (kind == 2) ++ghostGrieferAppeals;
            else ++ghostCheaterAppeals;
            _track(id);
            return true;
        } catch (bytes memory reason) {
            if (kind == 1) _fail("honest appeal reverted", reason);
            else ++ghostKeeperMisses;
            return false;
        }
    }

    function _unexpected(string memory what) internal {
        ++ghostUnexpectedReverts;
        lastUnexpected = what;
    }

    function _fail(string memory what, bytes memory reason) internal {
        ++ghostDutyFailures;
        lastDutyFailure = reason.length >= 4 ? string.concat(what, " with selector ", _hex4(bytes4(reason))) : what;
    }

    function _hex4(bytes4 b) internal pure returns (string memory) {
        bytes memory out = new bytes(10);
        out[0] = "0";
        out[1] = "x";
        for (uint256 i = 0; i < 4; ++i) {
            out[2 + 2 * i] = bytes16("0123456789abcdef")[uint8(b[i]) >> 4];
            out[3 + 2 * i] = bytes16("0123456789abcdef")[uint8(b[i]) & 0xf];
        }
        return string(out);
    }

    // ================================================================== tracking

    function _track(uint256 id) internal {
        TrainingJob.Lease memory l = job.getLease(id);
        TrainingJob.Status prev = lastStatus[id];
        if (prev == TrainingJob.Status.Voting && (l.status != TrainingJob.Status.Voting || l.round != lastRound[id])) {
            if (block.timestamp <= lastDeadline[id]) ++ghostEarlyDecisions;
            else ++ghostLateCloses;
        }
        if (_terminal(prev)) {
            if (l.status != prev) ++ghostTerminalRewrites;
        } else if (_terminal(l.status)) {
            ++settleCount[id];
            _countSettlement(id, l);
        }
        lastStatus[id] = l.status;
        lastRound[id] = l.round;
        lastDeadline[id] = l.deadline;
    }

    function _countSettlement(uint256 id, TrainingJob.Lease memory l) internal {
        if (l.status == TrainingJob.Status.Returned) {
            ++ghostReturned;
            uint256 fee = _min(expiryFee, _min(slashAmount, lockedBeforeSettle));
            forfeit[l.worker] += fee;
            ghostFeesDue += fee;
            return;
        }
        if (l.status == TrainingJob.Status.Paid) {
            ++ghostPaid;
        } else if (l.status == TrainingJob.Status.Slashed) {
            ++ghostSlashed;
            forfeit[l.worker] += _min(slashAmount, lockedBeforeSettle);
        } else {
            ++ghostLapsed;
        }
        for (uint256 r = 1; r <= l.round; ++r) {
            if (_plurality(id, r - 1) != l.outcome) {
                ++ghostAppealsWon;
            } else {
                ++ghostAppealsLost;
                forfeit[job.appellants(id, r)] += job.appealBondFor(r);
            }
        }
        if (!excused[id] && l.outcome != truthOf(l.worker)) ++ghostWrongFinal;
    }

    /// @dev Track every lease (catches a call changing a lease it was not about) and rebuild the open list.
    function _syncAll() internal {
        uint256 count = job.leaseCount();
        delete openLeases;
        for (uint256 id = 1; id <= count; ++id) {
            _track(id);
            if (_open(lastStatus[id])) openLeases.push(id);
        }
    }

    // ================================================================== picking

    uint8 internal constant PICK_HONEST_SUBMITTABLE = 1;
    uint8 internal constant PICK_CHEATER_LEASED = 2;
    uint8 internal constant PICK_VOTING = 3;
    uint8 internal constant PICK_APPEAL_WRONG = 4;
    uint8 internal constant PICK_APPEAL_RIGHT = 5;
    uint8 internal constant PICK_SEEDABLE = 6;
    uint8 internal constant PICK_COMMITTEE_DRAWABLE = 7;
    uint8 internal constant PICK_DECIDING = 8;
    uint8 internal constant PICK_LEASED = 9;
    uint8 internal constant PICK_CHEATER_APPEAL = 10;
    uint8 internal constant PICK_SETTLED = 11;

    /// @dev A lease matching `want`, scanning ids from `seed % leaseCount + 1` (so seed = id - 1 tries id
    ///      first); 0 if none.
    function _pick(uint256 seed, uint8 want) internal view returns (uint256) {
        uint256 count = job.leaseCount();
        for (uint256 k = 0; k < count; ++k) {
            uint256 id = 1 + ((seed % count + k) % count);
            if (_wants(id, job.getLease(id), want)) return id;
        }
        return 0;
    }

    function _wants(uint256 id, TrainingJob.Lease memory l, uint8 want) internal view returns (bool) {
        TrainingJob.Status st = l.status;
        if (want == PICK_HONEST_SUBMITTABLE) {
            return
                st == TrainingJob.Status.Leased && isHonestWorker[l.worker] && l.seed != 0
                    && block.timestamp <= l.deadline;
        }
        if (want == PICK_CHEATER_LEASED) {
            return st == TrainingJob.Status.Leased && l.worker == cheater && block.timestamp <= l.deadline;
        }
        if (want == PICK_VOTING) return _votable(id, l);
        if (want == PICK_APPEAL_WRONG || want == PICK_APPEAL_RIGHT || want == PICK_CHEATER_APPEAL) {
            if (!_appealOpen(l)) return false;
            if (want == PICK_CHEATER_APPEAL) {
                return l.worker == cheater && job.outcomeOf(id) == TrainingJob.Outcome.Reject;
            }
            bool right = job.outcomeOf(id) == truthOf(l.worker);
            return want == PICK_APPEAL_RIGHT ? right : !right;
        }
        if (want == PICK_SEEDABLE) {
            return st == TrainingJob.Status.Leased && l.seed == 0 && block.number > l.anchorBlock
                && blockhash(l.anchorBlock) != 0;
        }
        if (want == PICK_COMMITTEE_DRAWABLE) {
            if (st != TrainingJob.Status.Voting) return false;
            uint256 start = _start(id, l.round);
            (TrainingJob.Round memory rd,) = job.getRound(id, l.round);
            return rd.seed == 0 && block.number > start && blockhash(start) != 0;
        }
        if (want == PICK_DECIDING) return st == TrainingJob.Status.Voting || st == TrainingJob.Status.Decided;
        if (want == PICK_LEASED) return st == TrainingJob.Status.Leased;
        if (want == PICK_SETTLED) return _terminal(st);
        return false;
    }

    function _votable(uint256 id, TrainingJob.Lease memory l) internal view returns (bool) {
        return
            l.status == TrainingJob.Status.Voting && block.timestamp <= l.deadline && _start(id, l.round) < block.number;
    }

    function _pickMember(uint256 id, address[] storage group, uint256 seed) internal view returns (address) {
        uint256 r = job.getLease(id).round;
        for (uint256 j = 0; j < group.length; ++j) {
            address v = group[(seed % group.length + j) % group.length];
            if (!_hasVoted(id, r, v) && job.memberWeight(id, r, v) > 0) return v;
        }
        return address(0);
    }

    function _pickLoser(uint256 id, TrainingJob.Lease memory l, uint256 seed) internal view returns (address) {
        uint256 winning = l.outcome == TrainingJob.Outcome.Accept ? 1 : 2;
        uint256 n = validators.length;
        for (uint256 j = 0; j < n; ++j) {
            address v = validators[(seed % n + j) % n];
            uint256 ballot = job.ballots(id, v);
            if (ballot & LOSER_BIT != 0) continue;
            for (uint256 r = 0; r <= l.round; ++r) {
                uint256 code = (ballot >> (2 * r)) & 3;
                if (code != 0 && code != winning) return v;
            }
        }
        return address(0);
    }

    function _pickVoter(uint256 id, uint256 seed) internal view returns (address) {
        uint256 n = validators.length;
        for (uint256 j = 0; j < n; ++j) {
            address v = validators[(seed % n + j) % n];
            uint256 ballot = job.ballots(id, v);
            if (ballot & LOSER_BIT == 0 && ballot & 0xff != 0) return v;
        }
        return address(0);
    }

    /// @dev A member of round r that did not vote, was not penalized yet and, by the ghost book, was enlisted
    ///      at the round's start; with `anyMember` (a reckless keeper), any member of the round, voters,
    ///      members already penalized and members not enlisted included (all of which must be refused).
    function _pickAbsent(uint256 id, uint256 r, uint256 seed, bool anyMember) internal view returns (address) {
        uint256 n = validators.length;
        uint256 start = _start(id, r);
        for (uint256 j = 0; j < n; ++j) {
            address v = validators[(seed % n + j) % n];
            if (!anyMember) {
                uint256 ballot = job.ballots(id, v);
                if ((ballot >> (2 * r)) & 3 != 0 || ballot & (1 << (ABSENT_BITS + r)) != 0) continue;
                if (!ghostEnlistedFor(v, start)) continue;
            }
            if (job.memberWeight(id, r, v) > 0) return v;
        }
        return address(0);
    }

    function _honestAppellant() internal returns (address) {
        return honestValidators[appellantTurn++ % honestValidators.length];
    }

    // ================================================================== lease state helpers

    function _open(TrainingJob.Status st) internal pure returns (bool) {
        return st == TrainingJob.Status.Leased || st == TrainingJob.Status.Voting || st == TrainingJob.Status.Decided;
    }

    function _terminal(TrainingJob.Status st) internal pure returns (bool) {
        return st >= TrainingJob.Status.Paid;
    }

    function _start(uint256 id, uint256 r) internal view returns (uint256) {
        (TrainingJob.Round memory rd,) = job.getRound(id, r);
        return rd.startBlock;
    }

    function _hasVoted(uint256 id, uint256 r, address v) internal view returns (bool) {
        return (job.ballots(id, v) >> (2 * r)) & 3 != 0;
    }

    /// @dev Decided, or Voting with its vote window passed (closed lazily by the next call).
    function _decidedNow(TrainingJob.Lease memory l) internal view returns (bool) {
        return l.status == TrainingJob.Status.Decided
            || (l.status == TrainingJob.Status.Voting && block.timestamp > l.deadline);
    }

    /// @dev The appeal deadline of a decided (or closed-by-time) round; the final round has none (its own deadline).
    function _appealDeadline(TrainingJob.Lease memory l) internal view returns (uint256) {
        if (l.status == TrainingJob.Status.Voting && l.round < appealRounds) return uint256(l.deadline) + appealWindow;
        return l.deadline;
    }

    function _finalizable(TrainingJob.Lease memory l) internal view returns (bool) {
        return l.round >= appealRounds || block.timestamp > _appealDeadline(l);
    }

    function _appealOpen(TrainingJob.Lease memory l) internal view returns (bool) {
        return _decidedNow(l) && l.round < appealRounds && block.timestamp <= _appealDeadline(l);
    }

    function _roundClosed(TrainingJob.Lease memory l, uint256 r) internal view returns (bool) {
        return r < l.round || l.status != TrainingJob.Status.Voting || block.timestamp > l.deadline;
    }

    /// @dev Whether round r was decided by a majority of its total weight (then nobody was absent).
    function _roundMajority(uint256 id, uint256 r) internal view returns (bool) {
        (TrainingJob.Round memory rd,) = job.getRound(id, r);
        uint256 total = rd.totalWeight;
        if (rd.seed == 0) {
            uint256 start = _start(id, r);
            if (start == 0 || start >= block.number) return true;
            total = registry.totalValidatorWeightAt(start - 1);
        }
        uint256 leading = rd.acceptWeight > rd.rejectWeight ? rd.acceptWeight : rd.rejectWeight;
        return 2 * leading > total;
    }

    function _plurality(uint256 id, uint256 r) internal view returns (TrainingJob.Outcome) {
        (TrainingJob.Round memory rd,) = job.getRound(id, r);
        if (rd.acceptWeight > rd.rejectWeight) return TrainingJob.Outcome.Accept;
        if (rd.rejectWeight > rd.acceptWeight) return TrainingJob.Outcome.Reject;
        return TrainingJob.Outcome.Void;
    }

    /// @dev Whether `a` voted in or appealed into any round of the lease (only they can win its pools; a
    ///      reward credited to anyone else still shows up in `owed` once claimed).
    function _tookPart(uint256 id, uint256 round, address a) internal view returns (bool) {
        if (job.ballots(id, a) & 0xff != 0) return true;
        for (uint256 r = 1; r <= round; ++r) {
            if (job.appellants(id, r) == a) return true;
        }
        return false;
    }

    function _poolsOf(uint256 id) internal view returns (uint256) {
        (, uint128 voterPool, uint128 appellantPool) = job.disputes(id);
        return uint256(voterPool) + appellantPool;
    }

    function _sideWeights() internal view returns (uint256 honestW, uint256 colluderW) {
        for (uint256 i = 0; i < honestValidators.length; ++i) {
            (uint256 w,) = registry.currentWeights(honestValidators[i]);
            honestW += w;
        }
        for (uint256 i = 0; i < colluders.length; ++i) {
            (uint256 w,) = registry.currentWeights(colluders[i]);
            colluderW += w;
        }
    }

    /// @dev A slash of `amount` as the rules take it: from active, then unbonding, then locked stake, capped
    ///      at all three.
    function _capped(address a, uint256 amount) internal view returns (uint256) {
        (,, uint256 active, uint256 locked, uint256 unbonding,) = registry.nodeInfo(a);
        uint256 held = active + locked + unbonding;
        return amount < held ? amount : held;
    }

    /// @dev Before a call that may settle a lease: the worker's locked stake, which caps what the
    ///      settlement can take (slashes may already have reached the collateral).
    function _stashLocked(address w) internal {
        (,,, uint256 locked,,) = registry.nodeInfo(w);
        lockedBeforeSettle = locked;
    }

    function _stakeAndWallet(address a) internal view returns (uint256) {
        (,, uint256 active, uint256 locked, uint256 unbonding,) = registry.nodeInfo(a);
        return a.balance + active + locked + unbonding;
    }

    function _min(uint256 a, uint256 b) internal pure returns (uint256) {
        return a < b ? a : b;
    }

    function _bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        if (x >= lo && x <= hi) return x;
        return lo + (x % (hi - lo + 1));
    }
}

/// @title InvariantsTest
/// @notice Stateful invariants of trustless settlement, whatever sequence the handler runs:
///         (a) an actor who follows the protocol never ends with less than it put in;
///         (b) value is conserved in the registry and the job, bucket by bucket and account by account;
///         (c) no lease settles twice, and workers are paid exactly leaseCost per Paid lease;
///         (d) colluders, the griefer, the cheater and the hoarder never end with more than they put in;
///         (e) honest duties never fail, and every final outcome is the truth.
contract InvariantsTest is Fixture {
    uint256 internal constant BUDGET = 2 ether;
    uint256 internal constant WALLET = 100 ether;

    InvariantHandler internal handler;
    TrainingJob internal job;
    JobSpec internal s;
    Cast internal cast;

    function setUp() public {
        _deploy();
        vm.warp(1_700_000_000);
        vm.roll(1000);
        s = _spec();
        s.committeeSize = 2; // every first-round and appeal-round committee is a lottery; the final one is everyone

        cast.honestValidators = _actors("honest-validator-", 4);
        cast.colluders = _actors("colluder-", 2);
        cast.honestWorkers = _actors("honest-worker-", 3);
        cast.cheater = _actors("cheater", 1)[0];
        cast.cheaterValidator = _actors("cheater-validator", 1)[0];
        cast.hoarder = _actors("hoarder", 1)[0];
        cast.griefer = _actors("griefer", 1)[0];
        cast.keeper = makeAddr("keeper");

        // Honest validators hold 16 of 23.5 ether of validator weight; the colluders 7.5: two validators
        // and the cheater's own validator (a separate address: the cheater itself is a worker only, and an
        // address holds one staked role).
        uint256[4] memory honestStake = [uint256(5 ether), 4 ether, 4 ether, 3 ether];
        for (uint256 i = 0; i < 4; ++i) {
            _join(cast.honestValidators[i], VALIDATOR, honestStake[i]);
        }
        _join(cast.colluders[0], VALIDATOR, 2 ether);
        _join(cast.colluders[1], VALIDATOR, 2.5 ether);
        for (uint256 i = 0; i < 3; ++i) {
            _join(cast.honestWorkers[i], WORKER, 3 ether);
        }
        _join(cast.cheater, WORKER, 3 ether);
        _join(cast.cheaterValidator, VALIDATOR, 3 ether);
        _join(cast.hoarder, WORKER, 2 ether);
        _join(cast.griefer, WORKER, 2 ether);
        _roll(1);

        job = _createJob(s, BUDGET);
        handler = new InvariantHandler(registry, job, requester, BUDGET, cast); // the honest validators enlist
        vm.label(address(handler), "handler");
        targetContract(address(handler));

        // Lifecycle steps are listed more than once to weight them: a lease needs a claim, a submission,
        // votes, time and a finalize within one 32-call run.
        bytes4[47] memory w = [
            InvariantHandler.warp.selector,
            InvariantHandler.warp.selector,
            InvariantHandler.warp.selector,
            InvariantHandler.roll.selector,
            InvariantHandler.roll.selector,
            InvariantHandler.claimHonest.selector,
            InvariantHandler.claimHonest.selector,
            InvariantHandler.claimHonest.selector,
            InvariantHandler.claimCheater.selector,
            InvariantHandler.claimCheater.selector,
            InvariantHandler.claimHoarder.selector,
            InvariantHandler.submitHonest.selector,
            InvariantHandler.submitCheater.selector,
            InvariantHandler.submitCheater.selector,
            InvariantHandler.voteHonest.selector,
            InvariantHandler.voteBatchHonest.selector,
            InvariantHandler.voteColluder.selector,
            InvariantHandler.voteColluder.selector,
            InvariantHandler.setColluderEagerness.selector,
            InvariantHandler.appealHonest.selector,
            InvariantHandler.appealGriefer.selector,
            InvariantHandler.appealGriefer.selector,
            InvariantHandler.appealCheater.selector,
            InvariantHandler.drawSeed.selector,
            InvariantHandler.drawCommittee.selector,
            InvariantHandler.finalize.selector,
            InvariantHandler.finalize.selector,
            InvariantHandler.finalize.selector,
            InvariantHandler.reclaim.selector,
            InvariantHandler.recklessSettle.selector,
            InvariantHandler.slashLoser.selector,
            InvariantHandler.slashLoser.selector,
            InvariantHandler.penalizeAbsent.selector,
            InvariantHandler.penalizeAbsent.selector,
            InvariantHandler.enlistColluder.selector,
            InvariantHandler.delistColluder.selector,
            InvariantHandler.claimReward.selector,
            InvariantHandler.claimReward.selector,
            InvariantHandler.withdrawPayment.selector,
            InvariantHandler.withdrawPayment.selector,
            InvariantHandler.publishPolicy.selector,
            InvariantHandler.addStake.selector,
            InvariantHandler.addStake.selector,
            InvariantHandler.requestUnbond.selector,
            InvariantHandler.requestUnbond.selector,
            InvariantHandler.withdraw.selector,
            InvariantHandler.close.selector
        ];
        bytes4[] memory sels = new bytes4[](w.length);
        for (uint256 i = 0; i < w.length; ++i) {
            sels[i] = w[i];
        }
        targetSelector(FuzzSelector(address(handler), sels));
    }

    function _actors(string memory prefix, uint256 n) internal returns (address[] memory out) {
        out = new address[](n);
        for (uint256 i = 0; i < n; ++i) {
            out[i] = makeAddr(n == 1 ? prefix : string.concat(prefix, _digit(i)));
            vm.deal(out[i], WALLET);
        }
    }

    function _digit(uint256 i) internal pure returns (string memory) {
        return string(abi.encodePacked(bytes1(uint8(48 + i))));
    }

    // ================================================================== invariants

    /// @notice (a) Honest workers and honest validators never end with less than they put in, and the
    ///         rules never take anything from them.
    function invariant_a_honestActorsNeverLose() public view {
        uint256[] memory w = handler.wealths();
        uint256 n = handler.actorCount();
        for (uint256 i = 0; i < n; ++i) {
            address a = handler.actors(i);
            uint256 kind = handler.kindOf(a);
            if (kind == 3) continue;
            assertGe(
                w[i],
                handler.startWealth(a),
                kind == 1 ? "an honest validator lost value" : "an honest worker lost value"
            );
            assertEq(handler.forfeit(a), 0, "an honest actor forfeited value");
        }
    }

    /// @notice (b) Value is conserved: both contracts' balances match their books, the registry's totals
    ///         and the job's totalOwed are the sums over the accounts, reserved/bondsHeld/poolHeld match
    ///         the open leases, their bonds and the dispute pools.
    function invariant_b_valueConserved() public view {
        _assertRegistrySolvent();
        _assertJobSolvent(job);
        uint256 active;
        uint256 locked;
        uint256 unbonding;
        uint256 owedSum;
        uint256 n = handler.actorCount();
        uint256[] memory collateral = handler.expectedLocked();
        for (uint256 i = 0; i < n; ++i) {
            address a = handler.actors(i);
            active += _active(a);
            // No address holds both staked roles, so no voter slash or absence penalty can reach collateral:
            // every node's locked stake is exactly its open leases' collateral (a validator's is 0).
            assertEq(_locked(a), collateral[i], "locked stake != slashAmount x the node's open leases");
            (, uint8 roles,,,,) = registry.nodeInfo(a);
            assertFalse(roles & WORKER != 0 && roles & VALIDATOR != 0, "a node holds both staked roles");
            locked += _locked(a);
            unbonding += _unbonding(a);
            owedSum += job.owed(a);
        }
        assertEq(registry.totalActive(), active, "totalActive != sum of active stake");
        assertEq(registry.totalLocked(), locked, "totalLocked != sum of locked stake");
        assertEq(registry.totalUnbonding(), unbonding, "totalUnbonding != sum of unbonding stake");
        assertEq(job.totalOwed(), owedSum, "totalOwed != sum of what the actors are owed");

        uint256[8] memory counts = handler.statusCounts();
        uint256 open = counts[uint256(TrainingJob.Status.Leased)] + counts[uint256(TrainingJob.Status.Voting)]
            + counts[uint256(TrainingJob.Status.Decided)];
        assertEq(job.reserved(), open * job.leaseCost(), "reserved != open leases x leaseCost");
        assertEq(job.bondsHeld(), handler.openBonds(), "bondsHeld != bonds of open leases");
        (uint256 held, uint256 claimed) = handler.poolBook();
        assertEq(job.poolHeld(), held - claimed, "poolHeld != pending + pools - claimed rewards");
        // The winners' entitlements add up to the pools, up to one wei per account and pool of rounding.
        (uint256 shortfall, bool exceeded) = handler.rewardSums();
        assertFalse(exceeded, "entitlements exceed a lease's pools");
        assertLe(shortfall, 2 * n, "entitlements fall short of a lease's pools by more than rounding");
    }

    /// @notice (c) No lease settles twice; workers are paid exactly leaseCost per Paid lease, and the
    ///         escrow only ever goes to paid workers or back to the requester as unreserved escrow.
    function invariant_c_noLeaseSettlesTwice() public view {
        uint256 count = job.leaseCount();
        uint256 settled;
        for (uint256 id = 1; id <= count; ++id) {
            uint256 times = handler.settleCount(id);
            assertLe(times, 1, "a lease settled more than once");
            bool terminal = job.getLease(id).status >= TrainingJob.Status.Paid;
            assertEq(times == 1, terminal, "settle count disagrees with the lease's status");
            settled += times;
        }
        assertEq(handler.ghostTerminalRewrites(), 0, "a settled lease changed status");
        uint256[8] memory counts = handler.statusCounts();
        assertEq(counts[uint256(TrainingJob.Status.Paid)], handler.ghostPaid(), "Paid leases != Paid transitions");
        assertEq(counts[uint256(TrainingJob.Status.Slashed)], handler.ghostSlashed(), "Slashed != transitions");
        assertEq(counts[uint256(TrainingJob.Status.Returned)], handler.ghostReturned(), "Returned != transitions");
        assertEq(counts[uint256(TrainingJob.Status.Lapsed)], handler.ghostLapsed(), "Lapsed != transitions");
        assertEq(
            settled,
            handler.ghostPaid() + handler.ghostSlashed() + handler.ghostReturned() + handler.ghostLapsed(),
            "settlements != terminal leases"
        );
        uint256 paid = handler.ghostPaid() * job.leaseCost();
        assertEq(handler.ghostWorkerPay(), paid, "pay credited to workers != Paid leases x leaseCost");
        uint256 refunded = requester.balance - handler.requesterStart();
        assertEq(BUDGET, job.escrow() + paid + refunded, "budget != escrow + worker pay + refunds to requester");
    }

    /// @notice (d) The colluding minority, the griefer, the cheater and the hoarder never profit: each ends
    ///         with at most what it put in, less everything the rules took from it (`forfeit`: rejected
    ///         collateral, expiry fees, lost bonds, loser slashes, absence penalties).
    function invariant_d_adversariesNeverProfit() public view {
        uint256[] memory w = handler.wealths();
        uint256 n = handler.actorCount();
        for (uint256 i = 0; i < n; ++i) {
            address a = handler.actors(i);
            if (handler.kindOf(a) != 3) continue;
            assertLe(w[i] + handler.forfeit(a), handler.startWealth(a), "an adversary profited");
        }
    }

    /// @notice (e) Honest duties never fail, no honest validator is ever punished, nobody answers for absence
    ///         from a round it was not enlisted for, the truth always wins in the end, and every expiry fee is
    ///         burned.
    function invariant_e_truthWinsAndDutiesSucceed() public view {
        assertEq(handler.ghostDutyFailures(), 0, string.concat("honest duty failed: ", handler.lastDutyFailure()));
        assertEq(
            handler.ghostUnexpectedReverts(), 0, string.concat("a checked call reverted: ", handler.lastUnexpected())
        );
        assertEq(handler.ghostHonestPunished(), 0, "an honest validator was slashed or penalized");
        assertEq(handler.ghostUnenlistedPunished(), 0, "a member not enlisted for the round was penalized as absent");
        assertEq(handler.ghostSeatViolations(), 0, "a committee seat breaks the committee rule");
        assertEq(handler.ghostWrongFinal(), 0, "a final outcome contradicts the truth");
        assertGe(job.burned(), handler.ghostFeesDue(), "expiry fees not burned");
    }

    // ================================================================== scripted sequence

    /// @notice The handler drives every important transition: claim, seed, submit, committee draw, honest
    ///         and colluding votes, an early decision, a late close, honest / griefing / cheating appeals, a
    ///         decision overturned on appeal and appeals lost, Paid, Slashed, Returned, Lapsed (only through
    ///         an outage of every honest party), a loser slashed, an absent member penalized (and one that
    ///         never enlisted refused), enlisting and delisting, rewards claimed, payments and stake withdrawn,
    ///         the job closed; and every invariant holds afterwards.
    /// @dev Committee membership is random; where the script needs a particular committee it fixes the
    ///      round's start-block hash (vm.setBlockhash) to one that draws it, before anyone draws or votes.
    function test_handler_scriptedSequence_reachesEveryTransition() public {
        handler.setColluderEagerness(0); // colluders vote only when the script says
        handler.publishPolicy();
        for (uint256 i = 0; i < cast.honestValidators.length; ++i) {
            assertTrue(job.enlistedAt(cast.honestValidators[i]) != 0, "honest validators enlisted at the start");
        }
        handler.enlistColluder(0); // colluder 0 follows the job; colluder 1 and the cheater's validator do not
        assertEq(handler.ghostEnlists(), 1, "colluder 0 enlisted");
        assertEq(uint256(job.enlistedAt(cast.colluders[0])), block.number, "enlisted now");

        // L1 (honest worker 0): colluder 0 votes the lie first, two honest members decide Accept early; the
        // griefer appeals, three honest members of round 1 uphold it early: the appeal is lost, colluder 0 loses.
        handler.claimHonest(0);
        uint256 l1 = job.leaseCount();
        handler.roll(1); // honest duty: the seed is drawn
        assertTrue(job.getLease(l1).seed != 0, "L1 seed drawn by the honest duty");
        handler.submitHonest(l1 - 1);
        assertEq(uint256(_status(job, l1)), uint256(TrainingJob.Status.Voting), "L1 submitted");
        _rig(l1, 2, 4, 1, 1); // >= 2 honest members, colluder 0 a member
        handler.voteColluder(l1 - 1, 0);
        assertEq(handler.ghostColluderVotes(), 1, "colluder 0 voted the lie on L1");

        // L2 (cheater): round 0 has both colluders, the cheater's validator and no honest member; colluder 1
        // votes the lie, colluder 0 and the cheater's validator stay away. It closes at its deadline as Accept,
        // is appealed by an honest validator and overturned.
        handler.claimCheater();
        uint256 l2 = job.leaseCount();
        handler.roll(1); // honest duties: L1's honest members vote, deciding it early
        assertEq(uint256(_status(job, l1)), uint256(TrainingJob.Status.Decided), "L1 decided early");
        assertEq(uint256(_outcome(job, l1)), uint256(TrainingJob.Outcome.Accept), "L1 accepted");
        assertEq(handler.ghostEarlyDecisions(), 1, "early decision");
        handler.drawSeed(l2 - 1);
        assertEq(handler.ghostSeeds(), 2, "both seeds drawn");
        handler.submitCheater(l2 - 1, 0);
        _rig(l2, 0, 0, 7, 7); // no honest member; both colluders and the cheater's validator members
        handler.drawCommittee(l2 - 1);
        assertEq(handler.ghostCommitteesDrawn(), 1, "L2 committee drawn by a keeper");
        handler.voteColluder(l2 - 1, 1);
        assertEq(handler.ghostColluderVotes(), 2, "colluder 1 voted the lie on L2");

        handler.appealGriefer(l1 - 1);
        assertEq(handler.ghostGrieferAppeals(), 1, "griefer appealed L1");
        _rig(l1, 3, 4, 0, 0); // >= 3 honest members in round 1
        handler.roll(1);
        assertEq(uint256(_status(job, l1)), uint256(TrainingJob.Status.Decided), "L1 round 1 decided");
        assertEq(handler.ghostEarlyDecisions(), 2, "second early decision");

        // Settle both; time passes only through the handler, so every honest duty is done on the way.
        _settle(l1, false);
        assertEq(uint256(_status(job, l1)), uint256(TrainingJob.Status.Paid), "L1 paid");
        _settle(l2, true);
        assertEq(uint256(_status(job, l2)), uint256(TrainingJob.Status.Slashed), "L2 slashed");
        assertGe(handler.ghostLateCloses(), 1, "L2 round 0 closed late");
        assertGe(handler.ghostHonestAppeals(), 1, "an honest validator appealed L2");
        assertGe(handler.ghostAppealsWon(), 1, "L2 round 0 overturned");
        assertGe(handler.ghostAppealsLost(), 1, "the griefer's appeal lost");

        handler.slashLoser(l1 - 1, 0); // a reckless keeper tries an honest voter of L1 first: refused
        assertEq(handler.ghostLosersSlashed(), 0, "no honest voter slashed");
        handler.slashLoser(l1 - 1, 5);
        handler.slashLoser(l2 - 1, 5);
        assertEq(handler.ghostLosersSlashed(), 2, "both colluders slashed as losers");
        // A reckless keeper tries the cheater's validator, absent but never enlisted: refused.
        uint256 cvStake = _active(cast.cheaterValidator);
        handler.penalizeAbsent(l2 - 1, 6);
        assertEq(handler.ghostNotEnlistedRefusals(), 1, "the never-enlisted member refused as NotEnlisted");
        assertEq(handler.ghostAbsentPenalized(), 0, "nobody penalized yet");
        assertEq(_active(cast.cheaterValidator), cvStake, "the never-enlisted member untouched");
        handler.penalizeAbsent(l2 - 1, 5);
        assertEq(handler.ghostAbsentPenalized(), 1, "colluder 0 penalized as absent in L2 round 0");
        handler.delistColluder(0);
        assertEq(handler.ghostDelists(), 1, "colluder 0 left the job");
        for (uint256 i = 0; i < 8; ++i) {
            handler.claimReward(l1 - 1, i);
            handler.claimReward(l2 - 1, i);
        }
        assertGe(handler.ghostRewardsClaimed(), 2, "rewards claimed");
        for (uint256 i = 0; i < 12; ++i) {
            handler.withdrawPayment(i);
        }
        assertGe(handler.ghostWithdrawals(), 2, "payments withdrawn");

        // L3 (hoarder): claimed and left to expire; a keeper reclaims it.
        handler.claimHoarder();
        uint256 l3 = job.leaseCount();
        handler.reclaim(l3 - 1, 0);
        assertEq(uint256(_status(job, l3)), uint256(TrainingJob.Status.Returned), "L3 returned");

        // L4 (honest worker 1): a round 0 nobody sits on closes Void; with every honest party offline past
        // the appeal window, nobody appeals and it lapses.
        handler.claimHonest(1);
        uint256 l4 = job.leaseCount();
        handler.roll(1);
        handler.submitHonest(l4 - 1);
        _rig(l4, 0, 0, 0, 7);
        handler.outage(s.voteWindow + s.appealWindow + 1);
        handler.finalize(l4 - 1, 1);
        assertEq(uint256(_status(job, l4)), uint256(TrainingJob.Status.Lapsed), "L4 lapsed");

        // Stake moves: honest worker 0 adds, unbonds and (after the unbonding period) withdraws.
        handler.addStake(6, 1 ether);
        handler.requestUnbond(6, 1 ether);
        handler.withdraw(6, 0);
        assertEq(handler.ghostStakeWithdrawals(), 1, "stake withdrawn");
        handler.close(0);
        assertTrue(job.closed(), "closed");

        _logCoverage();
        assertGt(handler.ghostClaims(), 0, "claims");
        assertGt(handler.ghostSubmits(), 0, "submits");
        assertGt(handler.ghostHonestVotes(), 0, "honest votes");
        assertGt(handler.ghostFinalRounds(), 0, "a final round seated everyone");
        assertGt(handler.ghostCheaterAppeals() + handler.ghostGrieferAppeals(), 0, "griefing appeals");
        assertEq(handler.ghostPaid(), 1, "one paid");
        assertEq(handler.ghostSlashed(), 1, "one slashed");
        assertEq(handler.ghostReturned(), 1, "one returned");
        assertEq(handler.ghostLapsed(), 1, "one lapsed");

        invariant_a_honestActorsNeverLose();
        invariant_b_valueConserved();
        invariant_c_noLeaseSettlesTwice();
        invariant_d_adversariesNeverProfit();
        invariant_e_truthWinsAndDutiesSucceed();
    }

    /// @dev Drive a lease to settlement through the handler (finalize with time jumps; the cheater appeals
    ///      its rejection while it can when `cheaterAppeals`).
    function _settle(uint256 id, bool cheaterAppeals) internal {
        for (uint256 i = 0; i < 12 && job.getLease(id).status < TrainingJob.Status.Paid; ++i) {
            if (cheaterAppeals) handler.appealCheater(id - 1);
            handler.roll(1);
            handler.finalize(id - 1, 2); // even: let time pass to where it settles; not a multiple of 3: no sweep
        }
        assertTrue(job.getLease(id).status >= TrainingJob.Status.Paid, "lease settled");
    }

    /// @dev Fix the start-block hash of the lease's current round so its committee has between `minHonest`
    ///      and `maxHonest` honest members and, over the colluders selected by `careMask` (bit j: the handler's
    ///      colluder j; bit 2 is the cheater's validator), exactly the members in `colluderMask`. Mines the
    ///      round's start block if needed (no time passes).
    function _rig(uint256 id, uint256 minHonest, uint256 maxHonest, uint256 colluderMask, uint256 careMask) internal {
        uint256 r = job.getLease(id).round;
        (TrainingJob.Round memory rd,) = job.getRound(id, r);
        assertEq(uint256(uint160(rd.seed)), 0, "rig: committee already drawn");
        if (vm.getBlockNumber() <= rd.startBlock) vm.roll(uint256(rd.startBlock) + 1);
        for (uint256 i = 0; i < 20_000; ++i) {
            InvariantVm(address(vm)).setBlockhash(rd.startBlock, keccak256(abi.encode("rig", id, r, i)));
            uint256 honest;
            for (uint256 j = 0; j < cast.honestValidators.length; ++j) {
                if (job.memberWeight(id, r, cast.honestValidators[j]) > 0) ++honest;
            }
            if (honest < minHonest || honest > maxHonest) continue;
            uint256 mask;
            for (uint256 j = 0; j < handler.colluderCount(); ++j) {
                if (job.memberWeight(id, r, handler.colluders(j)) > 0) mask |= 1 << j;
            }
            if (mask & careMask == colluderMask) return;
        }
        revert("rig: no such committee");
    }

    function _logCoverage() internal {
        emit log_named_uint("claims", handler.ghostClaims());
        emit log_named_uint("seeds", handler.ghostSeeds());
        emit log_named_uint("submits", handler.ghostSubmits());
        emit log_named_uint("committees drawn", handler.ghostCommitteesDrawn());
        emit log_named_uint("votes", handler.ghostVotes());
        emit log_named_uint("  honest", handler.ghostHonestVotes());
        emit log_named_uint("  colluding", handler.ghostColluderVotes());
        emit log_named_uint("early decisions", handler.ghostEarlyDecisions());
        emit log_named_uint("late closes", handler.ghostLateCloses());
        emit log_named_uint("appeals", handler.ghostAppeals());
        emit log_named_uint("  honest", handler.ghostHonestAppeals());
        emit log_named_uint("  griefer", handler.ghostGrieferAppeals());
        emit log_named_uint("  cheater", handler.ghostCheaterAppeals());
        emit log_named_uint("appeals won (overturned)", handler.ghostAppealsWon());
        emit log_named_uint("appeals lost", handler.ghostAppealsLost());
        emit log_named_uint("paid", handler.ghostPaid());
        emit log_named_uint("slashed", handler.ghostSlashed());
        emit log_named_uint("returned", handler.ghostReturned());
        emit log_named_uint("lapsed", handler.ghostLapsed());
        emit log_named_uint("losers slashed", handler.ghostLosersSlashed());
        emit log_named_uint("absent penalized", handler.ghostAbsentPenalized());
        emit log_named_uint("  refused: not enlisted", handler.ghostNotEnlistedRefusals());
        emit log_named_uint("colluder enlists", handler.ghostEnlists());
        emit log_named_uint("colluder delists", handler.ghostDelists());
        emit log_named_uint("rewards claimed", handler.ghostRewardsClaimed());
        emit log_named_uint("payments withdrawn", handler.ghostWithdrawals());
        emit log_named_uint("stake withdrawn", handler.ghostStakeWithdrawals());
        emit log_named_uint("committee seats checked (rounds)", handler.ghostSeatChecks());
        emit log_named_uint("  of which final rounds", handler.ghostFinalRounds());
        emit log_named_uint("keeper misses", handler.ghostKeeperMisses());
    }
}

/// @title InvariantRegressionTest
/// @notice Minimal reproductions of two contract bugs this suite ran into in the previous revision of the
///         contracts (both fixed in the current one); they now pin the fixed behaviour.
///         1. penalizeAbsent checked `status < Voting`, and Returned (expired, never submitted) sorts after
///            Voting: round 0 of a lease that never had a round was drawn from its claim block's hash and its
///            "members" were penalized, the wei stuck in the lease's pending pool forever (the invariant
///            campaign found it: honest validators lost value).
///         2. Validator weight counted locked collateral, but a loser's slash reached only active and unbonding
///            stake and slashLoser marks the voter done whatever it took: a dual-role node whose stake was all
///            locked voted with full weight, slashed itself for 0 right after settlement, and kept its stake.
///            Now an address holds one staked role: the dual-role node cannot exist, a voter cannot lock
///            collateral, and its loser slash takes voterSlash in full.
contract InvariantRegressionTest is Fixture {
    TrainingJob internal job;
    JobSpec internal s;

    function setUp() public {
        _deploy();
        vm.warp(1_700_000_000);
        vm.roll(1000);
        _join(worker, WORKER, 2 ether);
        // Three equal validators, committee size 3: k * w >= W, so each sits on every committee.
        _join(v1, VALIDATOR, 4 ether);
        _join(v2, VALIDATOR, 4 ether);
        _join(v3, VALIDATOR, 4 ether);
        _roll(1);
        s = _spec();
    }

    /// @notice An expired lease that was never submitted has no rounds: nobody can be absent from them (not
    ///         even an enlisted validator, which would answer for absence from a real round).
    function test_regression_penalizeAbsent_refusesANeverSubmittedLease() public {
        job = _createJob(s, 1 ether);
        _enlist(job, v1);
        _roll(1);
        uint256 id = _claim(job, worker);
        _warp(s.leaseDuration + 1);
        _roll(1); // the claim block's hash is still available (the old code drew "round 0" from it)
        job.reclaim(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Returned), "returned");
        assertEq(job.memberWeight(id, 0, v1), 0, "a never-submitted lease has no committee");
        uint256 before = _active(v1);

        vm.prank(outsider);
        (bool ok,) = address(job).call(abi.encodeCall(TrainingJob.penalizeAbsent, (id, 0, v1)));
        (uint128 pending,,) = job.disputes(id);
        assertFalse(ok, "penalizeAbsent accepted a lease that was never submitted");
        assertEq(_active(v1), before, "a validator was penalized as absent from a round that never existed");
        assertEq(pending, 0, "wei stuck in a Returned lease's pending pool");
    }

    /// @notice The dual-role node of bug 2 cannot join; as a validator it cannot lock its stake as
    ///         collateral, and when it loses it pays voterSlash in full, even triggering the slash itself.
    function test_regression_slashLoser_dualRoleRefused_loserPaysInFull() public {
        s.committeeSize = 7; // W = 14 ether: k * w >= W for the 2-ether node too, so it surely sits
        job = _createJob(s, 1 ether);
        vm.prank(trainer);
        job.publishPolicy(1, keccak256("v1"));
        address dual = makeAddr("dual-role-liar");
        vm.deal(dual, 10 ether);
        uint256 key = _peerKey(dual);
        bytes memory pid = _peerIdOf(key);
        bytes memory sig = _peerSig(registry, key, dual);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, BOTH));
        vm.prank(dual);
        registry.join{value: 2 ether}(pid, sig, BOTH);
        _join(dual, VALIDATOR, 2 ether);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, dual, WORKER));
        vm.prank(dual);
        job.claim(); // a validator cannot lock its stake as collateral
        assertEq(_active(dual), 2 ether, "all stake free and slashable");
        assertEq(_locked(dual), 0, "nothing locked");
        _roll(1);

        uint256 id = _claimReady(job, worker);
        _submit(job, worker, id, 1);
        assertEq(job.memberWeight(id, 0, dual), 2 ether, "the validator votes with its own stake");
        _vote(job, dual, id, false); // the lie
        _vote(job, v1, id, true);
        _vote(job, v2, id, true); // 8 of 14 ether: accepted early
        _warp(s.appealWindow + 1);
        job.finalize(id);
        assertEq(uint256(_status(job, id)), uint256(TrainingJob.Status.Paid), "paid");

        uint256 held = _active(dual) + _locked(dual) + _unbonding(dual);
        vm.prank(dual);
        job.slashLoser(id, dual); // while every wei of its stake is locked
        uint256 taken = held - (_active(dual) + _locked(dual) + _unbonding(dual));
        assertEq(taken, s.voterSlash, "a losing voter whose weight was locked collateral escaped its slash");
        vm.prank(outsider);
        (bool again,) = address(job).call(abi.encodeCall(TrainingJob.slashLoser, (id, dual)));
        assertFalse(again, "a loser slashed twice for one lease");
    }
}
