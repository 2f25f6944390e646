// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Helpers, RogueCaller} from "./Helpers.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {TrainingJob} from "../src/TrainingJob.sol";

/// @title NodeRegistryTest
/// @notice Every external function of NodeRegistry: identity (peer-ID proofs), stake buckets, the job-only
///         collateral and slashing entry points, and the validator weight history; fuzzed amounts and keys.
/// @dev After every state change the registry's balance invariant (balance == active + locked + unbonding)
///      is checked with `_assertRegistrySolvent`.
contract NodeRegistryTest is Helpers {
    uint256 internal constant T0 = 1_700_000_000;
    /// @dev 5^3 + 7 is not a square mod p: no point has x = 5.
    uint256 internal constant X_OFF_CURVE = 5;
    uint256 internal constant P = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEFFFFFC2F;

    /// @dev A factory-made job, used only as an authorised caller of lock/release/slash.
    TrainingJob internal slasher;

    function setUp() public {
        _deploy();
        vm.warp(T0);
        vm.roll(100);
        slasher = _createJob(_spec(), 1 ether);
    }

    // ------------------------------------------------------------------ helpers

    function _proof(address who) internal returns (bytes memory peerId, bytes memory sig) {
        uint256 key = _peerKey(who);
        peerId = _peerIdOf(key);
        sig = _peerSig(registry, key, who);
    }

    function _weight(address who) internal view returns (uint256 w) {
        (w,) = registry.currentWeights(who);
    }

    function _total() internal view returns (uint256 t) {
        (, t) = registry.currentWeights(address(0));
    }

    function _expectJoinRevert(
        address who,
        bytes memory peerId,
        bytes memory sig,
        uint8 roles,
        uint256 stake,
        bytes memory err
    ) internal {
        vm.expectRevert(err);
        vm.prank(who);
        registry.join{value: stake}(peerId, sig, roles);
    }

    // ------------------------------------------------------------------ constructor / factory

    function test_constructor_setsParameters() public view {
        assertEq(registry.minWorkerStake(), MIN_WORKER, "minWorkerStake");
        assertEq(registry.minValidatorStake(), MIN_VALIDATOR, "minValidatorStake");
        assertEq(uint256(registry.unbondingPeriod()), uint256(UNBONDING), "unbondingPeriod");
        assertEq(registry.deployer(), address(this), "deployer");
        assertEq(registry.factory(), address(factory), "factory");
        assertEq(registry.PEER_BINDING_TAG(), keccak256("rollnet/peer-binding/v1"), "tag");
    }

    function test_setFactory_onceByDeployerNonZero() public {
        NodeRegistry r = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        vm.expectRevert(NodeRegistry.NotDeployer.selector);
        vm.prank(outsider);
        r.setFactory(address(factory));
        vm.expectRevert(NodeRegistry.ZeroAddress.selector);
        r.setFactory(address(0));
        vm.expectEmit(false, false, false, true, address(r));
        emit NodeRegistry.FactorySet(address(factory));
        r.setFactory(address(factory));
        assertEq(r.factory(), address(factory), "set");
        vm.expectRevert(NodeRegistry.FactoryAlreadySet.selector);
        r.setFactory(address(0xbeef));
        assertEq(r.factory(), address(factory), "unchanged");
    }

    function test_minStakeFor_isLargestMinimumOfRoles() public view {
        assertEq(registry.minStakeFor(WORKER), MIN_WORKER, "worker");
        assertEq(registry.minStakeFor(VALIDATOR), MIN_VALIDATOR, "validator");
        assertEq(registry.minStakeFor(BOTH), MIN_VALIDATOR, "both (a mask join refuses)");
        assertEq(registry.minStakeFor(TRAINER_ROLE), 0, "trainer needs no stake");
        assertEq(registry.minStakeFor(TRAINER_ROLE | WORKER), MIN_WORKER, "trainer+worker");
        assertEq(registry.minStakeFor(TRAINER_ROLE | VALIDATOR), MIN_VALIDATOR, "trainer+validator");
    }

    // ------------------------------------------------------------------ join

    function test_join_worker_recordsNodeStakeAndPeer() public {
        (bytes memory pid, bytes memory sig) = _proof(worker);
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.NodeJoined(worker, pid, WORKER, MIN_WORKER);
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(pid, sig, WORKER);

        (bytes memory peer, uint8 roles, uint256 active, uint256 locked, uint256 unbonding, uint64 readyAt) =
            registry.nodeInfo(worker);
        assertEq(peer, pid, "peerId");
        assertEq(uint256(roles), uint256(WORKER), "roles");
        assertEq(active, MIN_WORKER, "active");
        assertEq(locked + unbonding + readyAt, 0, "no locked/unbonding");
        assertEq(registry.ownerOfPeer(pid), worker, "ownerOfPeer");
        assertEq(registry.peerOwner(keccak256(pid)), worker, "peerOwner");
        assertEq(registry.totalActive(), MIN_WORKER, "totalActive");
        assertTrue(registry.isActive(worker, WORKER), "active worker");
        assertFalse(registry.isActive(worker, VALIDATOR), "not a validator");
        assertEq(_weight(worker), 0, "a worker has no validator weight");
        assertEq(_total(), 0, "total weight");
        _assertRegistrySolvent();
    }

    function test_join_validator_hasWeightFromItsBlock() public {
        _join(v1, VALIDATOR, 3 ether);
        assertTrue(registry.isActive(v1, VALIDATOR), "validator");
        assertFalse(registry.isActive(v1, WORKER), "not a worker");
        assertEq(_weight(v1), 3 ether, "weight = stake");
        assertEq(_total(), 3 ether, "total");
        _roll(1);
        (uint256 w, uint256 t) = registry.weightsAt(v1, block.number - 1);
        assertEq(w, 3 ether, "weight at join block");
        assertEq(t, 3 ether, "total at join block");
        (w, t) = registry.weightsAt(v1, block.number - 2);
        assertEq(w + t, 0, "nothing before the join block");
        _assertRegistrySolvent();
    }

    /// @notice An address holds one staked role: worker and validator together are refused whatever the
    ///         stake (with or without the trainer role), and nothing is bound or staked.
    function test_join_bothStakedRoles_revertInvalidRoles() public {
        (bytes memory pid, bytes memory sig) = _proof(v1);
        uint8[2] memory dual = [BOTH, BOTH | TRAINER_ROLE];
        for (uint256 i = 0; i < dual.length; ++i) {
            _expectJoinRevert(
                v1, pid, sig, dual[i], 10 ether, abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, dual[i])
            );
        }
        (, uint8 roles,,,,) = registry.nodeInfo(v1);
        assertEq(uint256(roles), 0, "not registered");
        assertEq(registry.ownerOfPeer(pid), address(0), "peer not bound");
        assertEq(address(registry).balance, 0, "nothing staked");
        assertEq(_total(), 0, "no weight");
        // The same address joins with one staked role.
        _join(v1, VALIDATOR, MIN_VALIDATOR);
        assertTrue(registry.isActive(v1, VALIDATOR), "validator");
        assertFalse(registry.isActive(v1, WORKER), "not a worker");
        _assertRegistrySolvent();
    }

    /// @notice The trainer role, which needs no stake, combines with either staked role.
    function test_join_trainerCombinesWithOneStakedRole() public {
        _join(worker, WORKER | TRAINER_ROLE, MIN_WORKER);
        (, uint8 roles,,,,) = registry.nodeInfo(worker);
        assertEq(uint256(roles), uint256(WORKER | TRAINER_ROLE), "worker+trainer roles");
        assertTrue(registry.isActive(worker, WORKER), "worker");
        assertTrue(registry.isActive(worker, TRAINER_ROLE), "trainer");
        assertFalse(registry.isActive(worker, VALIDATOR), "not a validator");
        assertEq(_weight(worker), 0, "a worker has no validator weight");

        _join(v1, VALIDATOR | TRAINER_ROLE, MIN_VALIDATOR);
        (, roles,,,,) = registry.nodeInfo(v1);
        assertEq(uint256(roles), uint256(VALIDATOR | TRAINER_ROLE), "validator+trainer roles");
        assertTrue(registry.isActive(v1, VALIDATOR), "validator");
        assertTrue(registry.isActive(v1, TRAINER_ROLE), "trainer");
        assertFalse(registry.isActive(v1, WORKER), "not a worker");
        assertEq(_weight(v1), MIN_VALIDATOR, "weighted");
        assertEq(_total(), MIN_VALIDATOR, "total");
        // A validator+trainer cannot lock lease collateral: it is no worker.
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, v1, WORKER));
        vm.prank(address(slasher));
        registry.lockCollateral(v1, 1 ether);
        _assertRegistrySolvent();
    }

    /// @notice join accepts exactly the non-empty masks of known roles without both staked roles.
    function testFuzz_join_rolesAcceptedIffOneStakedRoleAtMost(uint8 roles) public {
        bool valid = roles != 0 && roles & ~uint8(7) == 0 && roles & BOTH != BOTH;
        (bytes memory pid, bytes memory sig) = _proof(worker);
        if (!valid) {
            _expectJoinRevert(
                worker, pid, sig, roles, 10 ether, abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, roles)
            );
            return;
        }
        uint256 stake = registry.minStakeFor(roles);
        vm.prank(worker);
        registry.join{value: stake}(pid, sig, roles);
        assertFalse(
            registry.isActive(worker, WORKER) && registry.isActive(worker, VALIDATOR), "one staked role at most"
        );
        assertEq(_weight(worker), roles & VALIDATOR != 0 ? stake : 0, "weight only with the validator role");
        _assertRegistrySolvent();
    }

    function test_join_trainerRoleWithZeroStake() public {
        _join(trainer, TRAINER_ROLE, 0);
        (bytes memory peer, uint8 roles, uint256 active,,,) = registry.nodeInfo(trainer);
        assertEq(peer, _peerIdOf(_peerKey(trainer)), "peer bound");
        assertEq(uint256(roles), uint256(TRAINER_ROLE), "trainer role");
        assertEq(active, 0, "no stake");
        assertTrue(registry.isActive(trainer, TRAINER_ROLE), "an active trainer without stake");
        assertFalse(registry.isActive(trainer, WORKER), "not a worker");
        assertFalse(registry.isActive(trainer, VALIDATOR), "not a validator");
        assertEq(_weight(trainer), 0, "no weight");
        assertEq(address(registry).balance, 0, "nothing staked");
        _assertRegistrySolvent();
    }

    function test_join_revertsInvalidRoles() public {
        (bytes memory pid, bytes memory sig) = _proof(worker);
        uint8[4] memory bad = [uint8(0), 8, 9, 0xFF];
        for (uint256 i = 0; i < bad.length; ++i) {
            _expectJoinRevert(
                worker,
                pid,
                sig,
                bad[i],
                MIN_VALIDATOR,
                abi.encodeWithSelector(NodeRegistry.InvalidRoles.selector, bad[i])
            );
        }
        (, uint8 roles,,,,) = registry.nodeInfo(worker);
        assertEq(uint256(roles), 0, "not registered");
    }

    function test_join_revertsStakeBelowMinimum() public {
        (bytes memory pid, bytes memory sig) = _proof(worker);
        _expectJoinRevert(
            worker,
            pid,
            sig,
            WORKER,
            MIN_WORKER - 1,
            abi.encodeWithSelector(NodeRegistry.StakeBelowMinimum.selector, MIN_WORKER, MIN_WORKER - 1)
        );
        _expectJoinRevert(
            worker,
            pid,
            sig,
            VALIDATOR,
            MIN_VALIDATOR - 1,
            abi.encodeWithSelector(NodeRegistry.StakeBelowMinimum.selector, MIN_VALIDATOR, MIN_VALIDATOR - 1)
        );
        // The trainer role adds no minimum: validator+trainer needs the validator minimum (the worker's is
        // not enough), worker+trainer the worker minimum.
        _expectJoinRevert(
            worker,
            pid,
            sig,
            VALIDATOR | TRAINER_ROLE,
            MIN_WORKER,
            abi.encodeWithSelector(NodeRegistry.StakeBelowMinimum.selector, MIN_VALIDATOR, MIN_WORKER)
        );
        _expectJoinRevert(
            worker,
            pid,
            sig,
            WORKER | TRAINER_ROLE,
            MIN_WORKER - 1,
            abi.encodeWithSelector(NodeRegistry.StakeBelowMinimum.selector, MIN_WORKER, MIN_WORKER - 1)
        );
        assertEq(registry.ownerOfPeer(pid), address(0), "peer not bound");
        _assertRegistrySolvent();
    }

    function test_join_revertsAlreadyRegistered() public {
        _join(worker, WORKER, MIN_WORKER);
        uint256 key2 = _peerKey(worker2);
        bytes memory pid2 = _peerIdOf(key2);
        bytes memory sig2 = _peerSig(registry, key2, worker); // a valid proof of a new key for `worker`
        _expectJoinRevert(
            worker,
            pid2,
            sig2,
            WORKER,
            MIN_WORKER,
            abi.encodeWithSelector(NodeRegistry.AlreadyRegistered.selector, worker)
        );
        assertEq(registry.totalActive(), MIN_WORKER, "no second stake");
    }

    function test_join_revertsSignatureByAnotherKey() public {
        bytes memory pid = _peerIdOf(_peerKey(worker));
        bytes memory sig = _peerSig(registry, _peerKey(outsider), worker); // right message, wrong key
        _expectJoinRevert(
            worker, pid, sig, WORKER, MIN_WORKER, abi.encodeWithSelector(NodeRegistry.PeerSignatureInvalid.selector)
        );
    }

    function test_join_revertsSignatureForAnotherAddress() public {
        uint256 key = _peerKey(worker);
        bytes memory pid = _peerIdOf(key);
        bytes memory sigForWorker2 = _peerSig(registry, key, worker2); // the right key, bound to someone else
        _expectJoinRevert(
            worker,
            pid,
            sigForWorker2,
            WORKER,
            MIN_WORKER,
            abi.encodeWithSelector(NodeRegistry.PeerSignatureInvalid.selector)
        );
        // The signature was made for worker2, so worker2 may use it.
        vm.prank(worker2);
        registry.join{value: MIN_WORKER}(pid, sigForWorker2, WORKER);
        assertEq(registry.ownerOfPeer(pid), worker2, "bound to the address it signed");
    }

    function test_join_revertsSignatureForAnotherRegistry() public {
        NodeRegistry other = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        uint256 key = _peerKey(worker);
        bytes memory pid = _peerIdOf(key);
        bytes memory sigOther = _peerSig(other, key, worker);
        assertNotEq(other.peerBindingHash(worker), registry.peerBindingHash(worker), "domain differs by registry");
        _expectJoinRevert(
            worker,
            pid,
            sigOther,
            WORKER,
            MIN_WORKER,
            abi.encodeWithSelector(NodeRegistry.PeerSignatureInvalid.selector)
        );
        vm.prank(worker);
        other.join{value: MIN_WORKER}(pid, sigOther, WORKER);
        assertEq(other.ownerOfPeer(pid), worker, "valid where it was made for");
    }

    function test_join_revertsSignatureForAnotherChain() public {
        uint256 key = _peerKey(worker);
        bytes memory pid = _peerIdOf(key);
        uint256 home = block.chainid;
        vmx.chainId(home + 1);
        bytes memory sigElsewhere = _peerSig(registry, key, worker);
        bytes32 hashElsewhere = registry.peerBindingHash(worker);
        vmx.chainId(home);
        assertNotEq(hashElsewhere, registry.peerBindingHash(worker), "domain differs by chain");
        _expectJoinRevert(
            worker,
            pid,
            sigElsewhere,
            WORKER,
            MIN_WORKER,
            abi.encodeWithSelector(NodeRegistry.PeerSignatureInvalid.selector)
        );
    }

    function test_peerBindingHash_formula() public view {
        assertEq(
            registry.peerBindingHash(worker),
            keccak256(abi.encode(registry.PEER_BINDING_TAG(), block.chainid, address(registry), worker)),
            "binding hash"
        );
    }

    function test_join_revertsMalformedSignatures() public {
        uint256 key = _peerKey(worker);
        bytes memory pid = _peerIdOf(key);
        bytes memory good = _peerSig(registry, key, worker);
        bytes memory err = abi.encodeWithSelector(NodeRegistry.PeerSignatureInvalid.selector);
        _expectJoinRevert(worker, pid, "", WORKER, MIN_WORKER, err);
        // 64 bytes: r, s without v.
        bytes memory short = new bytes(64);
        for (uint256 i = 0; i < 64; ++i) {
            short[i] = good[i];
        }
        _expectJoinRevert(worker, pid, short, WORKER, MIN_WORKER, err);
        // The malleated twin (s' = n - s, flipped v) of a valid signature.
        (bytes32 r, bytes32 sv, uint8 v) = _split(good);
        uint256 n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141;
        bytes memory twin = abi.encodePacked(r, bytes32(n - uint256(sv)), v == 27 ? uint8(28) : uint8(27));
        _expectJoinRevert(worker, pid, twin, WORKER, MIN_WORKER, err);
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(pid, good, WORKER);
        assertEq(registry.ownerOfPeer(pid), worker, "the valid one works");
    }

    function _split(bytes memory sig) internal pure returns (bytes32 r, bytes32 s, uint8 v) {
        assembly {
            r := mload(add(sig, 32))
            s := mload(add(sig, 64))
            v := byte(0, mload(add(sig, 96)))
        }
    }

    function test_join_revertsMalformedPeerIds() public {
        uint256 key = _peerKey(worker);
        bytes memory pid = _peerIdOf(key);
        bytes memory sig = _peerSig(registry, key, worker);
        bytes memory unsupported = abi.encodeWithSelector(NodeRegistry.UnsupportedPeerId.selector);
        bytes32 x = _xOf(pid);

        // Wrong lengths.
        _expectJoinRevert(worker, _slice(pid, 38), sig, WORKER, MIN_WORKER, unsupported);
        _expectJoinRevert(worker, abi.encodePacked(pid, bytes1(0)), sig, WORKER, MIN_WORKER, unsupported);
        _expectJoinRevert(worker, "", sig, WORKER, MIN_WORKER, unsupported);
        // Wrong multihash / protobuf prefixes: sha256 multihash, Ed25519 key type, wrong data length.
        _expectJoinRevert(
            worker, abi.encodePacked(bytes6(0x122508021221), bytes1(pid[6]), x), sig, WORKER, MIN_WORKER, unsupported
        );
        _expectJoinRevert(
            worker, abi.encodePacked(bytes6(0x002508011221), bytes1(pid[6]), x), sig, WORKER, MIN_WORKER, unsupported
        );
        _expectJoinRevert(
            worker, abi.encodePacked(bytes6(0x002508021220), bytes1(pid[6]), x), sig, WORKER, MIN_WORKER, unsupported
        );
        // Uncompressed-point tag and a zero tag.
        _expectJoinRevert(
            worker, abi.encodePacked(bytes6(0x002508021221), bytes1(0x04), x), sig, WORKER, MIN_WORKER, unsupported
        );
        _expectJoinRevert(
            worker, abi.encodePacked(bytes6(0x002508021221), bytes1(0x00), x), sig, WORKER, MIN_WORKER, unsupported
        );
        // x not on the curve, x >= p.
        _expectJoinRevert(
            worker,
            abi.encodePacked(bytes6(0x002508021221), bytes1(0x02), bytes32(X_OFF_CURVE)),
            sig,
            WORKER,
            MIN_WORKER,
            unsupported
        );
        _expectJoinRevert(
            worker,
            abi.encodePacked(bytes6(0x002508021221), bytes1(0x02), bytes32(P)),
            sig,
            WORKER,
            MIN_WORKER,
            unsupported
        );
        _expectJoinRevert(
            worker,
            abi.encodePacked(bytes6(0x002508021221), bytes1(0x03), bytes32(type(uint256).max)),
            sig,
            WORKER,
            MIN_WORKER,
            unsupported
        );
        // The other point with the same x (flipped parity) is a valid key, but not the signer.
        bytes1 flipped = pid[6] == 0x02 ? bytes1(0x03) : bytes1(0x02);
        _expectJoinRevert(
            worker,
            abi.encodePacked(bytes6(0x002508021221), flipped, x),
            sig,
            WORKER,
            MIN_WORKER,
            abi.encodeWithSelector(NodeRegistry.PeerSignatureInvalid.selector)
        );

        vm.expectRevert(NodeRegistry.UnsupportedPeerId.selector);
        registry.peerKeyAddress(abi.encodePacked(bytes6(0x002508021221), bytes1(0x02), bytes32(X_OFF_CURVE)));
        (, uint8 roles,,,,) = registry.nodeInfo(worker);
        assertEq(uint256(roles), 0, "never registered");
        _assertRegistrySolvent();
    }

    function _xOf(bytes memory pid) internal pure returns (bytes32 x) {
        assembly {
            x := mload(add(pid, 39)) // bytes 7..38
        }
    }

    function _slice(bytes memory b, uint256 len) internal pure returns (bytes memory out) {
        out = new bytes(len);
        for (uint256 i = 0; i < len; ++i) {
            out[i] = b[i];
        }
    }

    function test_join_revertsPeerIdTaken() public {
        uint256 key = _peerKey(worker);
        bytes memory pid = _peerIdOf(key);
        bytes memory sig = _peerSig(registry, key, worker);
        vm.prank(worker);
        registry.join{value: MIN_WORKER}(pid, sig, WORKER);
        // Even with a valid signature of that key for worker2 (the key holder consented), one ID binds once.
        bytes memory sig2 = _peerSig(registry, key, worker2);
        _expectJoinRevert(
            worker2, pid, sig2, WORKER, MIN_WORKER, abi.encodeWithSelector(NodeRegistry.PeerIdTaken.selector, worker)
        );
        assertEq(registry.ownerOfPeer(pid), worker, "owner unchanged");
    }

    function testFuzz_peerKeyAddress_isTheKeysAddress(uint256 key) public {
        key = bound(key, 1, 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364140);
        bytes memory pid = _peerIdOf(key);
        assertEq(pid.length, 39, "length");
        assertEq(registry.peerKeyAddress(pid), vm.addr(key), "key address");
    }

    function testFuzz_join_onlyTheKeyHolderBindsFor(uint256 keySeed, uint256 wrongSeed, address node) public {
        vmx.assume(node != address(0) && node.code.length == 0 && uint160(node) > 0xffff);
        vmx.assume(node != address(registry) && node != address(factory) && node != address(this));
        vmx.assume(node != address(vm));
        uint256 n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364140;
        uint256 key = bound(keySeed, 1, n);
        uint256 wrong = bound(wrongSeed, 1, n);
        vmx.assume(vm.addr(wrong) != vm.addr(key));
        bytes memory pid = _peerIdOf(key);
        vm.deal(node, MIN_WORKER);
        _expectJoinRevert(
            node,
            pid,
            _peerSig(registry, wrong, node),
            WORKER,
            MIN_WORKER,
            abi.encodeWithSelector(NodeRegistry.PeerSignatureInvalid.selector)
        );
        bytes memory sig = _peerSig(registry, key, node);
        vm.prank(node);
        registry.join{value: MIN_WORKER}(pid, sig, WORKER);
        assertEq(registry.ownerOfPeer(pid), node, "bound by its key");
        _assertRegistrySolvent();
    }

    // ------------------------------------------------------------------ setPeerId

    function test_setPeerId_rotatesWithProofAndFreesOldId() public {
        _join(worker, WORKER, MIN_WORKER);
        bytes memory oldId = _peerIdOf(_peerKey(worker));
        uint256 newKey = uint256(keccak256("worker-rotated-key"));
        bytes memory newId = _peerIdOf(newKey);
        bytes memory newSig = _peerSig(registry, newKey, worker);

        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.PeerIdChanged(worker, newId);
        vm.prank(worker);
        registry.setPeerId(newId, newSig);
        (bytes memory peer,, uint256 active,,,) = registry.nodeInfo(worker);
        assertEq(peer, newId, "rotated");
        assertEq(active, MIN_WORKER, "stake untouched");
        assertEq(registry.ownerOfPeer(newId), worker, "new bound");
        assertEq(registry.ownerOfPeer(oldId), address(0), "old freed");

        // The freed ID can be bound again, but only with its key's proof for the new address.
        uint256 oldKey = _peerKey(worker);
        _expectJoinRevert(
            worker2,
            oldId,
            _peerSig(registry, oldKey, worker),
            WORKER,
            MIN_WORKER,
            abi.encodeWithSelector(NodeRegistry.PeerSignatureInvalid.selector)
        );
        bytes memory oldSig2 = _peerSig(registry, oldKey, worker2);
        vm.prank(worker2);
        registry.join{value: MIN_WORKER}(oldId, oldSig2, WORKER);
        assertEq(registry.ownerOfPeer(oldId), worker2, "re-bound by its key holder");
        _assertRegistrySolvent();
    }

    function test_setPeerId_reverts() public {
        uint256 newKey = uint256(keccak256("fresh"));
        bytes memory newId = _peerIdOf(newKey);
        bytes memory newSig = _peerSig(registry, newKey, worker);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotRegistered.selector, worker));
        vm.prank(worker);
        registry.setPeerId(newId, newSig);

        _join(worker, WORKER, MIN_WORKER);
        _join(worker2, WORKER, MIN_WORKER);
        bytes memory mine = _peerIdOf(_peerKey(worker));
        bytes memory mySig = _peerSig(registry, _peerKey(worker), worker);
        // No proof by the new key (the old key signed).
        vm.expectRevert(NodeRegistry.PeerSignatureInvalid.selector);
        vm.prank(worker);
        registry.setPeerId(newId, mySig);
        // Another node's ID, even with a (replayed) valid signature for that node.
        bytes memory theirs = _peerIdOf(_peerKey(worker2));
        bytes memory theirSig = _peerSig(registry, _peerKey(worker2), worker2);
        vm.expectRevert(NodeRegistry.PeerSignatureInvalid.selector);
        vm.prank(worker);
        registry.setPeerId(theirs, theirSig);
        // Its own current ID is taken (by itself).
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.PeerIdTaken.selector, worker));
        vm.prank(worker);
        registry.setPeerId(mine, mySig);
        // A malformed ID.
        vm.expectRevert(NodeRegistry.UnsupportedPeerId.selector);
        vm.prank(worker);
        registry.setPeerId(hex"0024080112201111", newSig);
        (bytes memory peer,,,,,) = registry.nodeInfo(worker);
        assertEq(peer, mine, "unchanged");
        assertEq(registry.ownerOfPeer(theirs), worker2, "theirs unchanged");
        assertEq(registry.ownerOfPeer(newId), address(0), "new id unbound");
    }

    // ------------------------------------------------------------------ setAddrs

    function test_setAddrs_storesClearsAndBoundsLength() public {
        bytes memory addrs = "/ip4/10.0.0.1/tcp/4001\n/ip4/10.0.0.1/udp/4001/quic-v1";
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotRegistered.selector, worker));
        vm.prank(worker);
        registry.setAddrs(addrs);

        _join(worker, WORKER, MIN_WORKER);
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.AddrsSet(worker, addrs);
        vm.prank(worker);
        registry.setAddrs(addrs);
        assertEq(registry.listenAddrs(worker), addrs, "stored");

        bytes memory max = new bytes(512);
        vm.prank(worker);
        registry.setAddrs(max);
        assertEq(registry.listenAddrs(worker).length, 512, "512 bytes accepted");
        bytes memory tooLong = new bytes(513);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.AddrsTooLong.selector, 513, 512));
        vm.prank(worker);
        registry.setAddrs(tooLong);

        vm.prank(worker);
        registry.setAddrs("");
        assertEq(registry.listenAddrs(worker).length, 0, "withdrawn");
    }

    // ------------------------------------------------------------------ addStake

    function test_addStake_raisesActiveAndWeight() public {
        _join(v1, VALIDATOR, MIN_VALIDATOR);
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.StakeAdded(v1, 1 ether, MIN_VALIDATOR + 1 ether);
        vm.prank(v1);
        registry.addStake{value: 1 ether}();
        assertEq(_active(v1), MIN_VALIDATOR + 1 ether, "active");
        assertEq(_weight(v1), MIN_VALIDATOR + 1 ether, "weight");
        assertEq(_total(), MIN_VALIDATOR + 1 ether, "total");
        assertEq(registry.totalActive(), MIN_VALIDATOR + 1 ether, "totalActive");
        _assertRegistrySolvent();
    }

    function test_addStake_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotRegistered.selector, outsider));
        vm.prank(outsider);
        registry.addStake{value: 1 ether}();
        _join(worker, WORKER, MIN_WORKER);
        vm.expectRevert(NodeRegistry.ZeroAmount.selector);
        vm.prank(worker);
        registry.addStake();
        assertEq(_active(worker), MIN_WORKER, "unchanged");
    }

    function test_addStake_restoresWeightAfterFallingBelowMinimum() public {
        _join(v1, VALIDATOR, MIN_VALIDATOR);
        vm.prank(v1);
        registry.requestUnbond(1);
        assertEq(_weight(v1), 0, "below minimum: no weight");
        assertEq(_total(), 0, "total");
        assertFalse(registry.isActive(v1, VALIDATOR), "inactive");
        vm.prank(v1);
        registry.addStake{value: 1}();
        assertEq(_weight(v1), MIN_VALIDATOR, "weight restored");
        assertTrue(registry.isActive(v1, VALIDATOR), "active again");
        _assertRegistrySolvent();
    }

    // ------------------------------------------------------------------ unbond / withdraw

    function test_requestUnbond_movesStakeAndSetsReadyAt() public {
        _join(v1, VALIDATOR, 5 ether);
        uint64 readyAt = uint64(block.timestamp) + UNBONDING;
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.UnbondRequested(v1, 2 ether, readyAt);
        vm.prank(v1);
        registry.requestUnbond(2 ether);
        (,, uint256 active,, uint256 unbonding, uint64 at) = registry.nodeInfo(v1);
        assertEq(active, 3 ether, "active");
        assertEq(unbonding, 2 ether, "unbonding");
        assertEq(uint256(at), uint256(readyAt), "readyAt");
        assertEq(registry.totalActive(), 3 ether, "totalActive");
        assertEq(registry.totalUnbonding(), 2 ether, "totalUnbonding");
        assertEq(_weight(v1), 3 ether, "unbonding stake carries no weight");
        _assertRegistrySolvent();

        // A later request restarts the clock for the whole unbonding balance.
        _warp(1 days);
        vm.prank(v1);
        registry.requestUnbond(1 ether);
        (,,,, unbonding, at) = registry.nodeInfo(v1);
        assertEq(unbonding, 3 ether, "accumulated");
        assertEq(uint256(at), block.timestamp + UNBONDING, "restarted");
        assertEq(_weight(v1), 2 ether, "weight at the minimum");
        vm.prank(v1);
        registry.requestUnbond(1);
        assertEq(_weight(v1), 0, "below the minimum: zero weight");
        _assertRegistrySolvent();
    }

    function test_requestUnbond_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotRegistered.selector, outsider));
        vm.prank(outsider);
        registry.requestUnbond(1);
        _join(worker, WORKER, 2 ether);
        vm.expectRevert(NodeRegistry.ZeroAmount.selector);
        vm.prank(worker);
        registry.requestUnbond(0);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, 2 ether + 1, 2 ether));
        vm.prank(worker);
        registry.requestUnbond(2 ether + 1);
    }

    function test_requestUnbond_lockedStakeCannotBeUnbonded() public {
        _join(worker, WORKER, 2 ether);
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 1.5 ether);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, 1 ether, 0.5 ether));
        vm.prank(worker);
        registry.requestUnbond(1 ether);
        vm.prank(worker);
        registry.requestUnbond(0.5 ether);
        assertEq(_locked(worker), 1.5 ether, "locked stays");
        assertEq(_active(worker), 0, "free stake gone");
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, 1, 0));
        vm.prank(worker);
        registry.requestUnbond(1);
        assertTrue(registry.isActive(worker, WORKER), "locked stake still counts as bonded");
        _assertRegistrySolvent();
    }

    function test_withdraw_timingBoundary() public {
        _join(worker, WORKER, 3 ether);
        vm.prank(worker);
        registry.requestUnbond(2 ether);
        (,,,,, uint64 readyAt) = registry.nodeInfo(worker);
        vm.warp(readyAt - 1);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, readyAt));
        vm.prank(worker);
        registry.withdraw();
        vm.warp(readyAt);
        uint256 before = worker.balance;
        vm.expectEmit(true, false, false, true, address(registry));
        emit NodeRegistry.Withdrawn(worker, 2 ether);
        vm.prank(worker);
        registry.withdraw();
        assertEq(worker.balance, before + 2 ether, "paid");
        assertEq(_unbonding(worker), 0, "cleared");
        assertEq(registry.totalUnbonding(), 0, "total cleared");
        assertEq(_active(worker), 1 ether, "active untouched");
        vm.expectRevert(NodeRegistry.NothingToWithdraw.selector);
        vm.prank(worker);
        registry.withdraw();
        _assertRegistrySolvent();
    }

    function test_withdraw_revertsNothingToWithdraw() public {
        vm.expectRevert(NodeRegistry.NothingToWithdraw.selector);
        vm.prank(outsider);
        registry.withdraw();
        _join(worker, WORKER, MIN_WORKER);
        vm.expectRevert(NodeRegistry.NothingToWithdraw.selector);
        vm.prank(worker);
        registry.withdraw();
    }

    function testFuzz_unbondWithdraw_exactlyAfterPeriod(uint256 stake, uint256 amount, uint256 wait) public {
        stake = bound(stake, MIN_WORKER, 100 ether);
        amount = bound(amount, 1, stake);
        wait = bound(wait, 0, 2 * uint256(UNBONDING));
        vm.deal(worker, stake);
        _join(worker, WORKER, stake);
        vm.prank(worker);
        registry.requestUnbond(amount);
        _assertRegistrySolvent();
        _warp(wait);
        vm.prank(worker);
        if (wait < UNBONDING) {
            vm.expectRevert(abi.encodeWithSelector(NodeRegistry.UnbondingNotFinished.selector, uint64(T0) + UNBONDING));
            registry.withdraw();
            assertEq(_unbonding(worker), amount, "still unbonding");
        } else {
            registry.withdraw();
            assertEq(worker.balance, amount, "withdrawn");
            assertEq(_unbonding(worker), 0, "cleared");
        }
        assertEq(_active(worker), stake - amount, "active");
        _assertRegistrySolvent();
    }

    // ------------------------------------------------------------------ job-only entry points

    function test_jobOnly_rejectsEoaContractAndTemplate() public {
        _join(worker, WORKER, 2 ether);
        RogueCaller rogue = new RogueCaller();
        address[3] memory callers = [outsider, address(rogue), address(implementation)];
        for (uint256 i = 0; i < callers.length; ++i) {
            bytes memory err = abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, callers[i]);
            vm.expectRevert(err);
            vm.prank(callers[i]);
            registry.lockCollateral(worker, 1 ether);
            vm.expectRevert(err);
            vm.prank(callers[i]);
            registry.releaseCollateral(worker, 0, 0, "x");
            vm.expectRevert(err);
            vm.prank(callers[i]);
            registry.slash(worker, 1 ether, "x");
        }
        // The contract calling for itself is refused too.
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, address(rogue)));
        rogue.hit(registry, worker, 1 ether);
        // So is the factory itself (it is not a job).
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, address(factory)));
        vm.prank(address(factory));
        registry.slash(worker, 1 ether, "x");
        assertFalse(factory.isJob(address(implementation)), "template is no job");
        assertEq(_active(worker), 2 ether, "untouched");
        _assertRegistrySolvent();
    }

    function test_jobOnly_revertsBeforeFactorySet() public {
        NodeRegistry r = new NodeRegistry(MIN_WORKER, MIN_VALIDATOR, UNBONDING);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotAuthorizedSlasher.selector, address(slasher)));
        vm.prank(address(slasher));
        r.slash(worker, 1, "x");
    }

    function test_lockCollateral_movesFreeStakeToLocked() public {
        _join(worker, WORKER, 2 ether);
        vm.expectEmit(true, true, false, true, address(registry));
        emit NodeRegistry.CollateralLocked(worker, address(slasher), 0.5 ether);
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 0.5 ether);
        assertEq(_active(worker), 1.5 ether, "active");
        assertEq(_locked(worker), 0.5 ether, "locked");
        assertEq(registry.totalLocked(), 0.5 ether, "totalLocked");
        assertEq(registry.totalActive(), 1.5 ether, "totalActive");
        _assertRegistrySolvent();
    }

    function test_lockCollateral_reverts() public {
        _join(v1, VALIDATOR, 5 ether);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, v1, WORKER));
        vm.prank(address(slasher));
        registry.lockCollateral(v1, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, outsider, WORKER));
        vm.prank(address(slasher));
        registry.lockCollateral(outsider, 0);

        _join(worker, WORKER, 1.2 ether);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, 1.3 ether, 1.2 ether));
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 1.3 ether);
        // Below the worker minimum after unbonding part: inactive.
        vm.prank(worker);
        registry.requestUnbond(0.3 ether);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.NotActive.selector, worker, WORKER));
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 0.1 ether);
        assertEq(_locked(worker), 0, "nothing locked");
    }

    function test_isActive_countsLockedStake() public {
        _join(worker, WORKER, MIN_WORKER);
        vm.prank(address(slasher));
        registry.lockCollateral(worker, MIN_WORKER);
        assertEq(_active(worker), 0, "no free stake");
        assertTrue(registry.isActive(worker, WORKER), "active + locked >= minimum");
        // It may still lock more only from free stake.
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientActiveStake.selector, 1, 0));
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 1);
    }

    function test_releaseCollateral_returnsRestAndSendsTaken() public {
        _join(worker, WORKER, 4 ether);
        _join(v1, VALIDATOR, 3 ether);
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 1 ether);
        assertEq(_weight(worker), 0, "collateral carries no validator weight");
        assertEq(_total(), 3 ether, "total: the validator's stake only");
        uint256 jobBalance = address(slasher).balance;

        vm.expectEmit(true, true, false, true, address(registry));
        emit NodeRegistry.CollateralReleased(worker, address(slasher), 1 ether, 0.25 ether, "fee");
        vm.prank(address(slasher));
        uint256 taken = registry.releaseCollateral(worker, 1 ether, 0.25 ether, "fee");
        assertEq(taken, 0.25 ether, "returned taken");
        assertEq(_locked(worker), 0, "released");
        assertEq(_active(worker), 3.75 ether, "rest returned");
        assertEq(address(slasher).balance, jobBalance + 0.25 ether, "taken sent to the job");
        assertEq(_weight(worker), 0, "still no weight");
        assertEq(_total(), 3 ether, "the take moves no validator weight");
        assertEq(registry.totalLocked(), 0, "totalLocked");
        _assertRegistrySolvent();
    }

    function test_releaseCollateral_revertsTakingMoreThanReleased_andReleasesOnlyWhatIsLeft() public {
        _join(worker, WORKER, 2 ether);
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.InsufficientLockedStake.selector, 0.6 ether, 0.5 ether));
        vm.prank(address(slasher));
        registry.releaseCollateral(worker, 0.5 ether, 0.6 ether, "x");
        assertEq(_locked(worker), 1 ether, "unchanged");
        // A slash that emptied active stake reached 0.4 ETH of the collateral: releasing the lease's 1 ETH
        // gives back and takes only what is left.
        vm.prank(address(slasher));
        registry.slash(worker, 1.4 ether, "voter");
        assertEq(_locked(worker), 0.6 ether, "slash reached locked last");
        vm.expectEmit(true, true, false, true, address(registry));
        emit NodeRegistry.CollateralReleased(worker, address(slasher), 0.6 ether, 0.6 ether, "x");
        vm.prank(address(slasher));
        uint256 got = registry.releaseCollateral(worker, 1 ether, 1 ether, "x");
        assertEq(got, 0.6 ether, "took only what was left");
        assertEq(_locked(worker), 0, "released");
        assertEq(_active(worker), 0, "nothing returned");
        _assertRegistrySolvent();
    }

    function test_slash_activeThenUnbondingThenLocked() public {
        _join(worker, WORKER, 5 ether);
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 1 ether); // active 4, locked 1
        vm.prank(worker);
        registry.requestUnbond(3 ether); // active 1, unbonding 3
        uint256 jobBalance = address(slasher).balance;

        vm.prank(address(slasher));
        uint256 taken = registry.slash(worker, 0.4 ether, "a");
        assertEq(taken, 0.4 ether, "from active");
        assertEq(_active(worker), 0.6 ether, "active first");
        assertEq(_unbonding(worker), 3 ether, "unbonding untouched");

        vm.expectEmit(true, true, false, true, address(registry));
        emit NodeRegistry.Slashed(worker, address(slasher), 2 ether, "b");
        vm.prank(address(slasher));
        taken = registry.slash(worker, 2 ether, "b");
        assertEq(taken, 2 ether, "spans buckets");
        assertEq(_active(worker), 0, "active emptied");
        assertEq(_unbonding(worker), 1.6 ether, "then unbonding");

        vm.prank(address(slasher));
        taken = registry.slash(worker, 100 ether, "c");
        assertEq(taken, 2.6 ether, "capped at all it holds, collateral last");
        assertEq(_unbonding(worker), 0, "unbonding emptied");
        assertEq(_locked(worker), 0, "then locked: no stake hides in collateral");
        assertEq(address(slasher).balance, jobBalance + 5 ether, "all taken sent to the job");
        assertFalse(registry.isActive(worker, WORKER), "below the minimum: no longer an active worker");

        vm.prank(address(slasher));
        taken = registry.slash(worker, 1 ether, "d");
        assertEq(taken, 0, "nothing left to take");
        vm.prank(address(slasher));
        assertEq(registry.slash(outsider, 1 ether, "e"), 0, "unregistered: nothing");
        _assertRegistrySolvent();
    }

    function testFuzz_slash_takesActiveThenUnbondingThenLocked(
        uint256 stake,
        uint256 lockAmt,
        uint256 unbond,
        uint256 amount
    ) public {
        stake = bound(stake, MIN_WORKER, 50 ether);
        lockAmt = bound(lockAmt, 0, stake);
        unbond = bound(unbond, 0, stake - lockAmt);
        amount = bound(amount, 0, 100 ether);
        vm.deal(worker, stake);
        _join(worker, WORKER, stake);
        if (lockAmt > 0) {
            vm.prank(address(slasher));
            registry.lockCollateral(worker, lockAmt);
        }
        if (unbond > 0) {
            vm.prank(worker);
            registry.requestUnbond(unbond);
        }
        uint256 active = stake - lockAmt - unbond;
        vm.prank(address(slasher));
        uint256 taken = registry.slash(worker, amount, "fuzz");
        uint256 expectActive = amount < active ? amount : active;
        uint256 rest = amount - expectActive;
        uint256 expectUnbond = rest < unbond ? rest : unbond;
        rest -= expectUnbond;
        uint256 expectLocked = rest < lockAmt ? rest : lockAmt;
        assertEq(taken, expectActive + expectUnbond + expectLocked, "taken");
        assertEq(_active(worker), active - expectActive, "active");
        assertEq(_unbonding(worker), unbond - expectUnbond, "unbonding");
        assertEq(_locked(worker), lockAmt - expectLocked, "locked last");
        _assertRegistrySolvent();
    }

    // ------------------------------------------------------------------ weight history

    function test_weights_checkpointedPerBlock() public {
        uint256 b0 = block.number;
        _join(v1, VALIDATOR, 2 ether);
        _join(v2, VALIDATOR | TRAINER_ROLE, 3 ether); // the trainer role changes nothing in the weight
        _join(worker, WORKER, 10 ether); // no validator role: no weight
        _roll(1);
        vm.prank(v1);
        registry.addStake{value: 1 ether}();
        vm.prank(v2);
        registry.requestUnbond(1.5 ether); // 1.5 < minimum: weight 0
        _roll(1);
        vm.prank(v1);
        registry.requestUnbond(0.5 ether); // 2.5
        vm.prank(v1);
        registry.addStake{value: 0.25 ether}(); // 2.75: the last change in a block wins
        _roll(1);

        (uint256 w1, uint256 t) = registry.weightsAt(v1, b0);
        (uint256 w2,) = registry.weightsAt(v2, b0);
        (uint256 ww,) = registry.weightsAt(worker, b0);
        assertEq(w1, 2 ether, "v1 at b0");
        assertEq(w2, 3 ether, "v2 at b0");
        assertEq(ww, 0, "worker never weighted");
        assertEq(t, 5 ether, "total at b0");
        (w1, t) = registry.weightsAt(v1, b0 + 1);
        (w2,) = registry.weightsAt(v2, b0 + 1);
        assertEq(w1, 3 ether, "v1 at b0+1");
        assertEq(w2, 0, "v2 below minimum at b0+1");
        assertEq(t, 3 ether, "total at b0+1");
        (w1, t) = registry.weightsAt(v1, b0 + 2);
        assertEq(w1, 2.75 ether, "v1 at b0+2");
        assertEq(t, 2.75 ether, "total at b0+2");
        assertEq(registry.totalValidatorWeightAt(b0 - 1), 0, "before anyone joined");
        assertEq(registry.totalValidatorWeightAt(b0), 5 ether, "total view b0");
        assertEq(registry.totalValidatorWeightAt(b0 + 1), 3 ether, "total view b0+1");

        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.FutureLookup.selector, block.number));
        registry.weightsAt(v1, block.number);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.FutureLookup.selector, block.number));
        registry.totalValidatorWeightAt(block.number);
        vm.expectRevert(abi.encodeWithSelector(NodeRegistry.FutureLookup.selector, block.number + 5));
        registry.totalValidatorWeightAt(block.number + 5);
        (uint256 cw, uint256 ct) = registry.currentWeights(v1);
        assertEq(cw, 2.75 ether, "current");
        assertEq(ct, 2.75 ether, "current total");
        _assertRegistrySolvent();
    }

    /// @notice Slashes update the weight history; a worker's collateral (locked, taken) never enters it,
    ///         because no address holds both staked roles.
    function test_weights_slashUpdatesHistory_collateralNeverWeighs() public {
        _join(v1, VALIDATOR, 4 ether);
        _join(v2, VALIDATOR, 4 ether);
        _join(worker, WORKER, 4 ether);
        vm.prank(address(slasher));
        registry.lockCollateral(worker, 1 ether);
        (uint256 w, uint256 t) = registry.currentWeights(worker);
        assertEq(w, 0, "collateral carries no weight");
        assertEq(t, 8 ether, "total: the validators only");
        uint256 b = block.number;
        _roll(1);
        vm.prank(address(slasher));
        registry.slash(v2, 2.5 ether, "x"); // 1.5 < minimum
        vm.prank(address(slasher));
        registry.slash(v1, 1 ether, "y"); // 3
        vm.prank(address(slasher));
        registry.releaseCollateral(worker, 1 ether, 1 ether, "z"); // the worker's collateral taken: no weight moves
        _roll(1);
        (w, t) = registry.weightsAt(v1, b + 1);
        assertEq(w, 3 ether, "v1 after its slash");
        assertEq(t, 3 ether, "v2 dropped out; the collateral take moved nothing");
        (w,) = registry.weightsAt(v2, b + 1);
        assertEq(w, 0, "v2 below minimum");
        (w,) = registry.weightsAt(worker, b + 1);
        assertEq(w, 0, "the worker never weighs");
        (w, t) = registry.weightsAt(v2, b);
        assertEq(w, 4 ether, "history before kept");
        assertEq(t, 8 ether, "total before kept");
        _assertRegistrySolvent();
    }

    /// @dev One staked role, with or without the trainer role: worker, validator, worker+trainer, validator+trainer.
    function _oneStakedRole(uint8 r) internal pure returns (uint8) {
        uint8[4] memory allowed = [WORKER, VALIDATOR, WORKER | TRAINER_ROLE, VALIDATOR | TRAINER_ROLE];
        return allowed[r % 4];
    }

    /// @notice Total weight always equals the sum of the validators' weights, each 0 or >= the minimum.
    function testFuzz_weights_totalIsSumOfValidatorWeights(
        uint256 s1,
        uint256 s2,
        uint256 s3,
        uint256 u1,
        uint256 u2,
        uint8 r3
    ) public {
        s1 = bound(s1, MIN_VALIDATOR, 20 ether);
        s2 = bound(s2, MIN_VALIDATOR, 20 ether);
        s3 = bound(s3, MIN_WORKER, 20 ether);
        uint8 roles3 = _oneStakedRole(r3);
        if (roles3 & VALIDATOR != 0 && s3 < MIN_VALIDATOR) s3 = MIN_VALIDATOR;
        _join(v1, VALIDATOR, s1);
        _join(v2, VALIDATOR, s2);
        _join(v3, roles3, s3);
        _roll(1);
        u1 = bound(u1, 0, s1);
        u2 = bound(u2, 0, s2);
        if (u1 > 0) {
            vm.prank(v1);
            registry.requestUnbond(u1);
        }
        if (u2 > 0) {
            vm.prank(v2);
            registry.requestUnbond(u2);
        }
        _roll(1);
        uint256 b = block.number - 1;
        (uint256 w1, uint256 t) = registry.weightsAt(v1, b);
        (uint256 w2,) = registry.weightsAt(v2, b);
        (uint256 w3,) = registry.weightsAt(v3, b);
        assertEq(w1, s1 - u1 >= MIN_VALIDATOR ? s1 - u1 : 0, "w1");
        assertEq(w2, s2 - u2 >= MIN_VALIDATOR ? s2 - u2 : 0, "w2");
        assertEq(w3, roles3 & VALIDATOR != 0 ? s3 : 0, "w3 only with the role");
        assertEq(t, w1 + w2 + w3, "total = sum");
        (w1,) = registry.weightsAt(v1, b - 1);
        assertEq(w1, s1, "history before the unbond");
        _assertRegistrySolvent();
    }
}
