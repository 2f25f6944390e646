// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {TestBase, Wallet} from "./TestBase.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {JobFactory} from "../src/JobFactory.sol";
import {TrainingJob} from "../src/TrainingJob.sol";
import {INodeRegistry, JobSpec} from "../src/Interfaces.sol";

/// @title Fixture
/// @notice A deployed registry + factory + job template with named actors, each with its own libp2p
///         (secp256k1) peer key, and helpers for the whole lease lifecycle: claim, seed, submit, committee
///         membership, votes, appeals and settlement. Shared by the unit, attack, fuzz, gas and invariant suites.
/// @dev Invariant: setUp leaves a registry whose factory is set, so any job created here can lock and slash;
///      every `_join` proves its peer ID with a real signature by that peer's key.
abstract contract Fixture is TestBase {
    uint256 internal constant MIN_WORKER = 1 ether;
    uint256 internal constant MIN_VALIDATOR = 2 ether;
    uint64 internal constant UNBONDING = 7 days;

    uint8 internal constant WORKER = 1;
    uint8 internal constant VALIDATOR = 2;
    /// @dev Both staked roles: a bitmask `join` refuses (an address holds one staked role), kept for
    ///      `minStakeFor`, the NotActive(worker | validator) error of `appeal`, and the refusal tests.
    uint8 internal constant BOTH = 3;
    uint8 internal constant TRAINER_ROLE = 4;

    NodeRegistry internal registry;
    JobFactory internal factory;
    TrainingJob internal implementation;

    address internal requester;
    address internal trainer;
    address internal worker;
    address internal worker2;
    address internal v1;
    address internal v2;
    address internal v3;
    address internal outsider;

    function _deploy() internal {
        registry = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        implementation = new TrainingJob();
        factory = new JobFactory(INodeRegistry(address(registry)), address(implementation));
        registry.setFactory(address(factory));
        vm.label(address(registry), "registry");
        vm.label(address(factory), "factory");
        vm.label(address(implementation), "implementation");

        requester = makeAddr("requester");
        trainer = makeAddr("trainer");
        worker = makeAddr("worker");
        worker2 = makeAddr("worker2");
        v1 = makeAddr("v1");
        v2 = makeAddr("v2");
        v3 = makeAddr("v3");
        outsider = makeAddr("outsider");
        address[8] memory all = [requester, trainer, worker, worker2, v1, v2, v3, outsider];
        for (uint256 i = 0; i < all.length; ++i) {
            vm.deal(all[i], 1000 ether);
        }
    }

    /// @notice A valid spec: 4 completions x 2 tasks a lease, staleness 2, committee 3, two appeals,
    ///         1-hour lease and vote windows, 1-day appeal windows (timeline 4 h + 3 days < 7 days).
    function _spec() internal view returns (JobSpec memory s) {
        s.modelHash = keccak256("base-model");
        s.taskConfigHash = keccak256("gsm8k-procedural");
        s.trainer = trainer;
        s.groupSize = 4;
        s.tasksPerLease = 2;
        s.maxStaleness = 2;
        s.committeeSize = 3;
        s.appealRounds = 2;
        s.clipEpsilonMilli = 200;
        s.clipDeltaMilli = 4000;
        s.leaseDuration = 1 hours;
        s.voteWindow = 1 hours;
        s.appealWindow = 1 days;
        s.rewardPerSample = 0.001 ether;
        s.slashAmount = 0.5 ether;
        s.expiryFee = 0.05 ether;
        s.voterSlash = 1 ether;
        s.absentPenalty = 0.1 ether;
        s.appealBond = 0.2 ether;
        s.modelName = "embedded";
        s.taskName = "gsm8k-procedural";
        s.maxNewTokens = 6;
        s.temperatureMilli = 1000;
        s.chatTemplate = false;
        s.stopOnEos = true;
        s.modelFilesHash = keccak256("embedded config and tokenizer");
        s.samplesChecked = 8; // every rollout: the sampled first round has its own tests
        s.minCheatPpm = 125_000;
    }

    function _cost(JobSpec memory s) internal pure returns (uint256) {
        return s.rewardPerSample * s.groupSize * s.tasksPerLease;
    }

    // ------------------------------------------------------------------ identity

    /// @notice The libp2p peer key of `who` (deterministic per address).
    function _peerKey(address who) internal pure returns (uint256) {
        return uint256(keccak256(abi.encode("rollnet-test-peer-key", who))) % (type(uint256).max / 2) + 1;
    }

    /// @notice The libp2p peer ID (identity multihash of a secp256k1 public key) of a private key.
    function _peerIdOf(uint256 key) internal returns (bytes memory) {
        Wallet memory w = vm.createWallet(key);
        uint8 prefix = w.publicKeyY % 2 == 0 ? 2 : 3;
        return abi.encodePacked(bytes6(0x002508021221), prefix, bytes32(w.publicKeyX));
    }

    /// @notice `key`'s signature binding its peer ID to `node` in `reg`.
    function _peerSig(NodeRegistry reg, uint256 key, address node) internal view returns (bytes memory) {
        bytes32 digest = keccak256(abi.encodePacked("\x19Ethereum Signed Message:\n32", reg.peerBindingHash(node)));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, digest);
        return abi.encodePacked(r, s, v);
    }

    function _join(address who, uint8 roles, uint256 stake) internal {
        uint256 key = _peerKey(who);
        bytes memory peerId = _peerIdOf(key);
        bytes memory sig = _peerSig(registry, key, who);
        vm.prank(who);
        registry.join{value: stake}(peerId, sig, roles);
    }

    // ------------------------------------------------------------------ blocks

    /// @notice Mine `n` blocks without moving time (randomness and stake snapshots are per block).
    function _roll(uint256 n) internal {
        vm.roll(vm.getBlockNumber() + n);
    }

    function _warp(uint256 seconds_) internal {
        vm.warp(vm.getBlockTimestamp() + seconds_);
    }

    // ------------------------------------------------------------------ job lifecycle

    function _createJob(JobSpec memory s, uint256 budget) internal returns (TrainingJob job) {
        vm.prank(requester);
        job = TrainingJob(payable(factory.createJob{value: budget}(s)));
        vm.label(address(job), "job");
    }

    function _claim(TrainingJob job, address who) internal returns (uint256 id) {
        vm.prank(who);
        id = job.claim();
    }

    /// @notice Claim, mine a block, draw the prompt seed: a lease ready to be worked.
    function _claimReady(TrainingJob job, address who) internal returns (uint256 id) {
        id = _claim(job, who);
        _roll(1);
        job.drawSeed(id);
    }

    /// @notice Submit at `version` and mine a block, so the round-0 committee's randomness exists.
    function _submit(TrainingJob job, address who, uint256 id, uint64 version) internal {
        vm.prank(who);
        job.submit(id, keccak256(abi.encode("rollouts", id)), version);
        _roll(1);
    }

    /// @notice `who` (an active validator) enlists in `job`: from the next block on it answers for absence there.
    function _enlist(TrainingJob job, address who) internal {
        vm.prank(who);
        job.enlist();
    }

    function _vote(TrainingJob job, address who, uint256 id, bool accept) internal {
        vm.prank(who);
        job.vote(id, accept);
    }

    function _appeal(TrainingJob job, address who, uint256 id) internal {
        uint256 round = job.getLease(id).round + 1;
        uint256 bond = job.appealBondFor(round);
        vm.prank(who);
        job.appeal{value: bond}(id);
        _roll(1);
    }

    /// @notice Every address of `candidates` that sits on the lease's current round's committee.
    function _members(TrainingJob job, uint256 id, address[] memory candidates)
        internal
        view
        returns (address[] memory members)
    {
        uint256 round = job.getLease(id).round;
        address[] memory found = new address[](candidates.length);
        uint256 n;
        for (uint256 i = 0; i < candidates.length; ++i) {
            if (job.memberWeight(id, round, candidates[i]) > 0) found[n++] = candidates[i];
        }
        members = new address[](n);
        for (uint256 i = 0; i < n; ++i) {
            members[i] = found[i];
        }
    }

    function _status(TrainingJob job, uint256 id) internal view returns (TrainingJob.Status) {
        return job.getLease(id).status;
    }

    function _outcome(TrainingJob job, uint256 id) internal view returns (TrainingJob.Outcome) {
        return job.getLease(id).outcome;
    }

    function _deadline(TrainingJob job, uint256 id) internal view returns (uint64) {
        return job.getLease(id).deadline;
    }

    function _active(address who) internal view returns (uint256 active) {
        (,, active,,,) = registry.nodeInfo(who);
    }

    function _locked(address who) internal view returns (uint256 locked) {
        (,,, locked,,) = registry.nodeInfo(who);
    }

    function _unbonding(address who) internal view returns (uint256 unbonding) {
        (,,,, unbonding,) = registry.nodeInfo(who);
    }

    /// @notice Everything `who` holds in the market: wallet, stake in every bucket, and what `job` owes it.
    function _wealth(TrainingJob job, address who) internal view returns (uint256) {
        (,, uint256 active, uint256 locked, uint256 unbonding,) = registry.nodeInfo(who);
        return who.balance + active + locked + unbonding + job.owed(who);
    }

    function _assertJobSolvent(TrainingJob job) internal view {
        assertEq(
            address(job).balance,
            job.escrow() + job.totalOwed() + job.bondsHeld() + job.poolHeld() + job.burned(),
            "job balance != escrow+owed+bonds+pool+burned"
        );
        assertLe(job.reserved(), job.escrow(), "reserved > escrow");
    }

    function _assertRegistrySolvent() internal view {
        assertEq(
            address(registry).balance,
            registry.totalActive() + registry.totalLocked() + registry.totalUnbonding(),
            "registry balance != active+locked+unbonding"
        );
    }
}
