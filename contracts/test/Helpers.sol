// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

import {Fixture} from "./Fixture.sol";
import {NodeRegistry} from "../src/NodeRegistry.sol";
import {TrainingJob} from "../src/TrainingJob.sol";

/// @notice Cheatcodes this suite needs beyond TestBase's `Vm`, at the same cheatcode address
///         (declared here so TestBase stays untouched; exact forge 1.7.1 signatures).
interface VmExtra {
    function snapshotState() external returns (uint256 snapshotId);
    function revertToState(uint256 snapshotId) external returns (bool success);
    function chainId(uint256 newChainId) external;
    function assume(bool condition) external pure;
    function expectRevert() external;
}

/// @notice A contract account that acts through `exec` (forwarding reverts) and refuses ether unless told
///         otherwise: an appellant or node whose `receive` reverts.
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
        require(acceptEther, "Puppet: refuses ether");
    }
}

/// @notice A worker contract that claims a lease and, in the same transaction, tries to learn its prompts:
///         it reads the lease's seed and tries to draw it.
contract SeedPeeker {
    function exec(address target, uint256 value, bytes calldata data) external returns (bytes memory ret) {
        bool ok;
        (ok, ret) = target.call{value: value}(data);
        if (!ok) {
            assembly {
                revert(add(ret, 32), mload(ret))
            }
        }
    }

    /// @return id The lease claimed.
    /// @return seen The seed visible in the claiming transaction.
    /// @return drawError The revert data of drawSeed tried in the claiming transaction (empty if it worked).
    function claimAndPeek(TrainingJob job) external returns (uint256 id, bytes32 seen, bytes memory drawError) {
        id = job.claim();
        seen = job.getLease(id).seed;
        try job.drawSeed(id) {
            drawError = "";
        } catch (bytes memory err) {
            drawError = err;
        }
    }

    receive() external payable {}
}

/// @notice Any contract that is not a factory-made job, trying the registry's job-only functions.
contract RogueCaller {
    function lock(NodeRegistry r, address node, uint256 amount) external {
        r.lockCollateral(node, amount);
    }

    function release(NodeRegistry r, address node, uint256 amount, uint256 taken) external returns (uint256) {
        return r.releaseCollateral(node, amount, taken, "rogue");
    }

    function hit(NodeRegistry r, address node, uint256 amount) external returns (uint256) {
        return r.slash(node, amount, "rogue");
    }

    receive() external payable {}
}

/// @title Helpers
/// @notice Shared helpers of the unit and attack suites on top of Fixture: extra cheatcodes, contract
///         actors that join with a real peer proof, loss arithmetic and lease shortcuts.
abstract contract Helpers is Fixture {
    VmExtra internal constant vmx = VmExtra(address(uint160(uint256(keccak256("hevm cheat code")))));

    /// @notice Join `who` (any address, e.g. a contract driven by `exec`) through `exec`, with a valid proof.
    function _joinPuppet(address who, uint8 roles, uint256 stake) internal {
        uint256 key = _peerKey(who);
        bytes memory peerId = _peerIdOf(key);
        bytes memory sig = _peerSig(registry, key, who);
        vm.deal(who, who.balance + stake);
        Puppet(payable(who)).exec(address(registry), stake, abi.encodeCall(NodeRegistry.join, (peerId, sig, roles)));
    }

    /// @notice How much `before` exceeds `after_` (0 if it does not).
    function _loss(uint256 before, uint256 after_) internal pure returns (uint256) {
        return before > after_ ? before - after_ : 0;
    }

    /// @notice after - before as a signed number.
    function _gain(uint256 before, uint256 after_) internal pure returns (int256) {
        return int256(after_) - int256(before);
    }

    function assertLtInt(int256 a, int256 b, string memory message) internal pure {
        if (a >= b) revert(message);
    }

    /// @notice Claim, draw the seed and submit at `version`: a lease whose round 0 is open and drawable.
    function _submitted(TrainingJob job, address who, uint64 version) internal returns (uint256 id) {
        id = _claimReady(job, who);
        _submit(job, who, id, version);
    }

    /// @notice Claim the reward (if any) and withdraw everything `who` is owed by `job`.
    function _cashOut(TrainingJob job, uint256 id, address who) internal {
        if (job.rewardOf(id, who) > job.rewardClaimed(id, who)) {
            vm.prank(who);
            job.claimReward(id);
        }
        if (job.owed(who) > 0) {
            vm.prank(who);
            job.withdrawPayment();
        }
    }
}
