// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Fixture} from "./Fixture.sol";
import {Vm, FuzzSelector} from "./TestBase.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {JobSpec} from "../src/Interfaces.sol";

/// @title Handler
/// @notice Drives random but mostly meaningful sequences against one registry and one job: stake moves,
///         time, the policy clock and every lease transition. Each action bounds its inputs and picks a
///         lease/actor for which the action can succeed, so deep states (paid, slashed, overturned) are reached.
/// @dev Invariant: every account the job can credit or the registry can hold stake for is in `actors`,
///      so the test can sum balances over them.
contract Handler {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    NodeRegistry public immutable registry;
    TrainingJob public immutable job;
    address public immutable trainer;
    address public immutable arbiter;
    address public immutable requester;

    address[] public actors;

    // Ghost counters: how often each transition actually happened (for coverage checks).
    uint256 public ghostJoins;
    uint256 public ghostWithdrawals;
    uint256 public ghostClaims;
    uint256 public ghostSubmits;
    uint256 public ghostVotes;
    uint256 public ghostPaid;
    uint256 public ghostSlashed;
    uint256 public ghostChallenges;
    uint256 public ghostOverturned;
    uint256 public ghostUpheld;
    uint256 public ghostUnbondingSlashed;
    uint256 public ghostVoterSlashes;
    uint256 public ghostReturned;
    uint256 public ghostLapsed;
    uint256 public ghostPayouts;

    constructor(NodeRegistry registry_, TrainingJob job_, address trainer_, address arbiter_, address requester_) {
        registry = registry_;
        job = job_;
        trainer = trainer_;
        arbiter = arbiter_;
        requester = requester_;
        // 3 workers, 4 validators, 1 node with both roles, 2 newcomers who may join later.
        uint8[10] memory roles = [1, 1, 1, 2, 2, 2, 2, 3, 0, 0];
        for (uint256 i = 0; i < roles.length; ++i) {
            address a = address(uint160(0xA000 + i));
            actors.push(a);
            vm.deal(a, 1000 ether);
            if (roles[i] != 0) {
                vm.prank(a);
                registry.join{value: roles[i] == 1 ? 3 ether : 4 ether}(abi.encodePacked("peer", a), roles[i]);
            }
        }
    }

    function actorCount() external view returns (uint256) {
        return actors.length;
    }

    // ================================================================== registry actions

    function join(uint256 who, uint256 roleSeed, uint256 amount) external {
        address a = actors[who % actors.length];
        (, uint8 roles,,,) = registry.nodeInfo(a);
        if (roles != 0) return;
        uint8 r = uint8(1 + (roleSeed % 3));
        amount = _bound(amount, registry.minStakeFor(r), 10 ether);
        vm.prank(a);
        registry.join{value: amount}(abi.encodePacked("peer", a), r);
        ++ghostJoins;
    }

    function addStake(uint256 who, uint256 amount) external {
        address a = actors[who % actors.length];
        (, uint8 roles,,,) = registry.nodeInfo(a);
        if (roles == 0) return;
        amount = _bound(amount, 1, 5 ether);
        vm.prank(a);
        registry.addStake{value: amount}();
    }

    function requestUnbond(uint256 who, uint256 amount) external {
        address a = actors[who % actors.length];
        (,, uint256 active,,) = registry.nodeInfo(a);
        if (active == 0) return;
        // A third of the time unbond everything, so later slashes have to reach unbonding stake.
        amount = amount % 3 == 0 ? active : _bound(amount, 1, active);
        vm.prank(a);
        registry.requestUnbond(amount);
    }

    function withdraw(uint256 who, uint256 jump) external {
        address a = actors[who % actors.length];
        (,,, uint256 unbonding, uint64 readyAt) = registry.nodeInfo(a);
        if (unbonding == 0) return;
        if (jump % 4 == 0 && block.timestamp < readyAt) vm.warp(readyAt);
        if (block.timestamp < readyAt) return;
        vm.prank(a);
        registry.withdraw();
        ++ghostWithdrawals;
    }

    function warp(uint256 dt) external {
        vm.warp(block.timestamp + _bound(dt, 1, 90 minutes));
    }

    // ================================================================== job actions

    function publishPolicy() external {
        uint64 v = job.currentVersion() + 1;
        vm.prank(trainer);
        job.publishPolicy(v, keccak256(abi.encode(v)));
    }

    function claim(uint256 who) external {
        address a = _pickActive(who, 1);
        if (a == address(0) || job.closed()) return;
        if (job.escrow() - job.reserved() < job.leaseCost()) return;
        vm.prank(a);
        job.claim();
        ++ghostClaims;
    }

    function submit(uint256 leaseSeed, uint256 lag) external {
        uint256 id = _pickLease(leaseSeed, TrainingJob.Status.Leased, TrainingJob.Status.Leased);
        if (id == 0) return;
        TrainingJob.Lease memory l = job.getLease(id);
        if (block.timestamp > l.deadline || !registry.isActive(l.worker, 1)) return;
        uint64 current = job.currentVersion();
        uint64 maxLag = job.spec().maxStaleness;
        lag = _bound(lag, 0, maxLag < current ? maxLag : current);
        vm.prank(l.worker);
        job.submit(id, keccak256(abi.encode(id, lag)), current - uint64(lag));
        ++ghostSubmits;
    }

    function attest(uint256 leaseSeed, uint256 valSeed, uint256 verdict) external {
        uint256 id = _pickLease(leaseSeed, TrainingJob.Status.Submitted, TrainingJob.Status.Submitted);
        if (id == 0) return;
        TrainingJob.Lease memory l = job.getLease(id);
        if (block.timestamp > l.deadline) return;
        address v = _pickVoter(valSeed, id, l.worker);
        if (v == address(0)) return;
        vm.prank(v);
        job.attest(id, verdict % 4 != 0); // 3 in 4 votes accept
        ++ghostVotes;
    }

    function attestBatch(uint256 valSeed, uint256 verdict) external {
        address v = _pickActive(valSeed, 2);
        if (v == address(0)) return;
        uint256 n = job.leaseCount();
        if (n > 8) n = 8;
        uint256[] memory ids = new uint256[](n);
        bool[] memory acc = new bool[](n);
        uint256 first = job.leaseCount() - n;
        for (uint256 i = 0; i < n; ++i) {
            ids[i] = first + i + 1;
            acc[i] = (verdict >> i) % 4 != 0;
            if (job.getLease(ids[i]).worker == v) return; // a worker may not vote on its own batch
        }
        vm.prank(v);
        job.attestBatch(ids, acc);
    }

    function lapse(uint256 leaseSeed, uint256 jump) external {
        uint256 id = _pickLease(leaseSeed, TrainingJob.Status.Submitted, TrainingJob.Status.Submitted);
        if (id == 0) return;
        uint64 deadline = job.getLease(id).deadline;
        if (jump % 4 == 0 && block.timestamp <= deadline) vm.warp(uint256(deadline) + 1);
        if (block.timestamp <= deadline) return;
        job.lapse(id);
        ++ghostLapsed;
    }

    function reclaim(uint256 leaseSeed, uint256 jump) external {
        uint256 id = _pickLease(leaseSeed, TrainingJob.Status.Leased, TrainingJob.Status.Leased);
        if (id == 0) return;
        uint64 deadline = job.getLease(id).deadline;
        if (jump % 4 == 0 && block.timestamp <= deadline) vm.warp(uint256(deadline) + 1);
        if (block.timestamp <= deadline) return;
        job.reclaim(id);
        ++ghostReturned;
    }

    function challenge(uint256 leaseSeed, uint256 who) external {
        uint256 id = _pickLease(leaseSeed, TrainingJob.Status.Accepted, TrainingJob.Status.Rejected);
        if (id == 0 || block.timestamp > job.getLease(id).deadline) return;
        address a = _pickActive(who, 3);
        if (a == address(0)) return;
        uint256 bond = job.spec().challengeBond;
        vm.prank(a);
        job.challenge{value: bond}(id);
        ++ghostChallenges;
    }

    function resolve(uint256 leaseSeed, uint256 verdict) external {
        uint256 id = _pickLease(leaseSeed, TrainingJob.Status.Challenged, TrainingJob.Status.Challenged);
        if (id == 0) return;
        (, uint64 deadline, bool originalAccepted,,) = job.challenges(id);
        if (block.timestamp > deadline) return;
        bool accept = verdict % 2 == 0;
        _settleCounted(id, true, accept);
        if (accept != originalAccepted) ++ghostOverturned;
        else ++ghostUpheld;
    }

    function finalize(uint256 leaseSeed, uint256 jump) external {
        uint256 id = _pickLease(leaseSeed, TrainingJob.Status.Accepted, TrainingJob.Status.Challenged);
        if (id == 0) return;
        uint64 deadline = job.getLease(id).deadline;
        if (job.getLease(id).status == TrainingJob.Status.Challenged) (, deadline,,,) = job.challenges(id);
        if (jump % 2 == 0 && block.timestamp <= deadline) vm.warp(uint256(deadline) + 1);
        if (block.timestamp <= deadline) return;
        _settleCounted(id, false, false);
    }

    function slashVoter(uint256 leaseSeed, uint256 valSeed) external {
        uint256 n = job.leaseCount();
        if (n == 0) return;
        for (uint256 k = 0; k < n; ++k) {
            uint256 id = 1 + ((leaseSeed % n + k) % n);
            (,, bool originalAccepted, bool overturned, bool resolved) = job.challenges(id);
            if (!resolved || !overturned) continue;
            uint8 losing = originalAccepted ? 1 : 2;
            for (uint256 j = 0; j < actors.length; ++j) {
                address v = actors[(valSeed % actors.length + j) % actors.length];
                if (job.votes(id, v) == losing) {
                    job.slashVoter(id, v);
                    ++ghostVoterSlashes;
                    return;
                }
            }
        }
    }

    function withdrawPayment(uint256 who) external {
        for (uint256 j = 0; j < actors.length; ++j) {
            address a = actors[(who % actors.length + j) % actors.length];
            if (job.owed(a) > 0) {
                vm.prank(a);
                job.withdrawPayment();
                ++ghostPayouts;
                return;
            }
        }
    }

    function close(uint256 seed) external {
        if (seed % 16 != 0) return; // rarely: a closed job takes no new claims for the rest of the run
        vm.prank(requester);
        job.close();
    }

    // ================================================================== picking

    function _countSettled(uint256 id) internal {
        TrainingJob.Status st = job.getLease(id).status;
        if (st == TrainingJob.Status.Paid) ++ghostPaid;
        else if (st == TrainingJob.Status.Slashed) ++ghostSlashed;
    }

    /// @dev Run a settlement and count it; notes when the slash had to reach the worker's unbonding stake.
    function _settleCounted(uint256 id, bool viaResolve, bool accept) internal {
        address w = job.getLease(id).worker;
        (,,, uint256 unbondingBefore,) = registry.nodeInfo(w);
        if (viaResolve) {
            vm.prank(arbiter);
            job.resolve(id, accept);
        } else {
            job.finalize(id);
        }
        (,,, uint256 unbondingAfter,) = registry.nodeInfo(w);
        if (unbondingAfter < unbondingBefore) ++ghostUnbondingSlashed;
        _countSettled(id);
    }

    /// @dev A lease whose status lies in [lo, hi], scanning from a random start; 0 if none.
    function _pickLease(uint256 seed, TrainingJob.Status lo, TrainingJob.Status hi) internal view returns (uint256) {
        uint256 n = job.leaseCount();
        for (uint256 k = 0; k < n; ++k) {
            uint256 id = 1 + ((seed % n + k) % n);
            TrainingJob.Status st = job.getLease(id).status;
            if (st >= lo && st <= hi) return id;
        }
        return 0;
    }

    /// @dev An actor active in any role of `roleMask`, scanning from a random start; 0 if none.
    function _pickActive(uint256 seed, uint8 roleMask) internal view returns (address) {
        for (uint256 j = 0; j < actors.length; ++j) {
            address a = actors[(seed % actors.length + j) % actors.length];
            if ((roleMask & 1 != 0 && registry.isActive(a, 1)) || (roleMask & 2 != 0 && registry.isActive(a, 2))) {
                return a;
            }
        }
        return address(0);
    }

    function _pickVoter(uint256 seed, uint256 id, address worker) internal view returns (address) {
        for (uint256 j = 0; j < actors.length; ++j) {
            address a = actors[(seed % actors.length + j) % actors.length];
            if (a != worker && registry.isActive(a, 2) && job.votes(id, a) == 0) return a;
        }
        return address(0);
    }

    function _bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        if (x >= lo && x <= hi) return x;
        return lo + (x % (hi - lo + 1));
    }
}

/// @title InvariantsTest
/// @notice Money never leaks: the registry holds exactly active + unbonding stake, and the job holds exactly
///         unspent escrow + owed payments + held bonds, whatever sequence of actions the handler runs.
contract InvariantsTest is Fixture {
    Handler internal handler;
    TrainingJob internal job;
    JobSpec internal s;

    function setUp() public {
        _deploy();
        vm.warp(1_700_000_000);
        vm.roll(100);
        s = _spec();
        // A slash of 2 ether against 3-ether workers reaches unbonding stake as soon as a worker unbonds 1 ether;
        // 4-ether validators stay exactly at the validator minimum after one voter slash.
        s.slashAmount = 2 ether;
        // Budget for 6 leases, so escrow exhaustion and release are exercised too.
        job = _createJob(s, 6 * _cost(s));
        handler = new Handler(registry, job, trainer, arbiter, requester);
        targetContract(address(handler));

        // Lifecycle steps are listed more than once: forge picks selectors uniformly, and a paid or slashed
        // lease needs claim, submit, two votes and a finalize within one 32-call run.
        bytes4[30] memory w = [
            Handler.join.selector,
            Handler.addStake.selector,
            Handler.requestUnbond.selector,
            Handler.withdraw.selector,
            Handler.warp.selector,
            Handler.publishPolicy.selector,
            Handler.claim.selector,
            Handler.claim.selector,
            Handler.submit.selector,
            Handler.submit.selector,
            Handler.attest.selector,
            Handler.attest.selector,
            Handler.attest.selector,
            Handler.attest.selector,
            Handler.attestBatch.selector,
            Handler.lapse.selector,
            Handler.reclaim.selector,
            Handler.challenge.selector,
            Handler.resolve.selector,
            Handler.finalize.selector,
            Handler.finalize.selector,
            Handler.slashVoter.selector,
            Handler.withdrawPayment.selector,
            Handler.withdrawPayment.selector,
            Handler.close.selector,
            Handler.submit.selector,
            Handler.claim.selector,
            Handler.challenge.selector,
            Handler.resolve.selector,
            Handler.slashVoter.selector
        ];
        bytes4[] memory sels = new bytes4[](w.length);
        for (uint256 i = 0; i < w.length; ++i) {
            sels[i] = w[i];
        }
        targetSelector(FuzzSelector(address(handler), sels));
    }

    /// @notice The handler itself works: a scripted sequence reaches every transition it can drive, and the
    ///         invariants hold after it. Random campaigns reach the long chains (overturn, voter slash) rarely.
    function test_handler_scriptedSequence_reachesEveryTransition() public {
        handler.publishPolicy();
        for (uint256 i = 0; i < 4; ++i) {
            handler.claim(i % 3); // workers 0,1,2 then 0 again: leases 1..4
        }
        for (uint256 i = 0; i < 3; ++i) {
            handler.submit(0, 0); // leases 1,2,3 (first Leased one each time)
        }
        handler.attest(0, 3, 1); // lease 1 accept x2
        handler.attest(0, 4, 1);
        handler.attest(0, 3, 0); // lease 2 reject x2
        handler.attest(0, 4, 0);
        handler.attest(0, 3, 1); // lease 3 accept x2
        handler.attest(0, 4, 1);
        assertEq(handler.ghostVotes(), 6, "six votes");
        assertEq(uint256(job.getLease(3).status), uint256(TrainingJob.Status.Accepted), "lease 3 accepted");
        handler.challenge(2, 0); // lease 3
        assertEq(handler.ghostChallenges(), 1, "challenged");
        handler.resolve(0, 1); // verdict odd: reject, overturning the acceptance
        assertEq(handler.ghostOverturned(), 1, "overturned");
        handler.slashVoter(0, 0);
        assertEq(handler.ghostVoterSlashes(), 1, "voter slashed");
        handler.finalize(0, 0); // lease 1: paid
        handler.finalize(0, 0); // lease 2: slashed
        assertEq(handler.ghostPaid(), 1, "paid");
        assertEq(handler.ghostSlashed(), 2, "slashed (overturned lease 3 and rejected lease 2)");
        handler.withdrawPayment(0);
        assertGt(handler.ghostPayouts(), 0, "payout");
        // An upheld challenge: the bond goes to escrow.
        uint256 upheld = _scriptedDecided(0, true);
        handler.challenge(upheld - 1, 1);
        uint256 escrowBefore = job.escrow();
        handler.resolve(upheld - 1, 0); // verdict even: accept, as decided
        assertEq(handler.ghostUpheld(), 1, "upheld");
        assertEq(job.escrow(), escrowBefore + s.challengeBond - job.leaseCost(), "bond in, pay out");
        // A rejected worker who unbonds everything is still slashed, from unbonding stake.
        uint256 fled = _scriptedDecided(1, false);
        address fleeing = job.getLease(fled).worker;
        handler.requestUnbond(1, 3); // amount % 3 == 0: unbond all active stake
        assertEq(_active(fleeing), 0, "all stake unbonding");
        handler.finalize(fled - 1, 0);
        assertEq(handler.ghostUnbondingSlashed(), 1, "slash reached unbonding stake");
        handler.reclaim(3, 0); // lease 4 expired during the challenge window
        assertEq(handler.ghostReturned(), 1, "returned");
        handler.claim(1);
        handler.submit(0, 0);
        handler.attestBatch(5, type(uint256).max);
        handler.lapse(0, 0);
        assertEq(handler.ghostLapsed(), 1, "lapsed");
        handler.join(8, 1, 0);
        assertEq(handler.ghostJoins(), 1, "joined");
        handler.addStake(8, 1 ether);
        handler.requestUnbond(8, 1 ether);
        handler.withdraw(8, 0);
        assertEq(handler.ghostWithdrawals(), 1, "withdrawn");
        handler.close(0);
        assertTrue(job.closed(), "closed");
        invariant_registryBalanceEqualsActivePlusUnbonding();
        invariant_jobBalanceEqualsEscrowPlusOwedPlusBonds();
        invariant_reservedWithinEscrow();
        invariant_reservedEqualsOpenLeasesTimesCost();
        invariant_bondsHeldEqualsOpenChallengesTimesBond();
        invariant_totalsEqualSumsOverAccounts();
    }

    /// @dev Through the handler: worker actors[w] claims and submits a lease that v-actors 3 and 4 decide.
    function _scriptedDecided(uint256 w, bool accept) internal returns (uint256 id) {
        handler.claim(w);
        id = job.leaseCount();
        assertEq(job.getLease(id).worker, handler.actors(w), "scripted claim");
        handler.submit(id - 1, 0);
        handler.attest(id - 1, 3, accept ? 1 : 0);
        handler.attest(id - 1, 4, accept ? 1 : 0);
        assertEq(
            uint256(job.getLease(id).status),
            uint256(accept ? TrainingJob.Status.Accepted : TrainingJob.Status.Rejected),
            "scripted decision"
        );
    }

    function invariant_registryBalanceEqualsActivePlusUnbonding() public view {
        assertEq(
            address(registry).balance,
            registry.totalActive() + registry.totalUnbonding(),
            "registry balance != totalActive + totalUnbonding"
        );
    }

    function invariant_jobBalanceEqualsEscrowPlusOwedPlusBonds() public view {
        assertEq(
            address(job).balance,
            job.escrow() + job.totalOwed() + job.bondsHeld(),
            "job balance != escrow + totalOwed + bondsHeld"
        );
    }

    function invariant_reservedWithinEscrow() public view {
        assertLe(job.reserved(), job.escrow(), "reserved > escrow");
    }

    function invariant_reservedEqualsOpenLeasesTimesCost() public view {
        uint256 open;
        uint256 n = job.leaseCount();
        for (uint256 id = 1; id <= n; ++id) {
            TrainingJob.Status st = job.getLease(id).status;
            if (st >= TrainingJob.Status.Leased && st <= TrainingJob.Status.Challenged) ++open;
        }
        assertEq(job.reserved(), open * job.leaseCost(), "reserved != open leases * leaseCost");
    }

    function invariant_bondsHeldEqualsOpenChallengesTimesBond() public view {
        uint256 open;
        uint256 n = job.leaseCount();
        for (uint256 id = 1; id <= n; ++id) {
            if (job.getLease(id).status == TrainingJob.Status.Challenged) ++open;
        }
        assertEq(job.bondsHeld(), open * s.challengeBond, "bondsHeld != open challenges * bond");
    }

    function invariant_totalsEqualSumsOverAccounts() public view {
        uint256 active;
        uint256 unbonding;
        uint256 owedSum;
        uint256 n = handler.actorCount();
        for (uint256 i = 0; i < n; ++i) {
            address a = handler.actors(i);
            active += _active(a);
            unbonding += _unbonding(a);
            owedSum += job.owed(a);
        }
        assertEq(registry.totalActive(), active, "totalActive != sum of active");
        assertEq(registry.totalUnbonding(), unbonding, "totalUnbonding != sum of unbonding");
        assertEq(job.totalOwed(), owedSum, "totalOwed != sum of owed");
    }
}
