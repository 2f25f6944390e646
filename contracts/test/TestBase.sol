// SPDX-License-Identifier: MIT
pragma solidity 0.8.30;

/// @notice The subset of Foundry's cheatcodes this suite uses, at the fixed cheatcode address.
/// @dev Invariant: every signature here matches forge 1.7.1's cheatcode ABI exactly; a wrong one
///      fails at call time with an unknown-selector revert.
interface Vm {
    function prank(address sender) external;
    function deal(address account, uint256 newBalance) external;
    function warp(uint256 newTimestamp) external;
    function roll(uint256 newHeight) external;
    function prevrandao(bytes32 newPrevrandao) external;
    function expectRevert(bytes4 revertData) external;
    function expectRevert(bytes calldata revertData) external;
    function expectEmit(bool checkTopic1, bool checkTopic2, bool checkTopic3, bool checkData, address emitter) external;
    function label(address account, string calldata newLabel) external;
    function addr(uint256 privateKey) external pure returns (address);
    function sign(uint256 privateKey, bytes32 digest) external pure returns (uint8 v, bytes32 r, bytes32 s);
    function createWallet(uint256 privateKey) external returns (Wallet memory wallet);
    function getBlockNumber() external view returns (uint256 height);
    function getBlockTimestamp() external view returns (uint256 timestamp);
    function cool(address target) external;
    function lastCallGas() external view returns (Gas memory gas);
}

/// @notice A key pair as forge's `createWallet` returns it.
struct Wallet {
    address addr;
    uint256 publicKeyX;
    uint256 publicKeyY;
    uint256 privateKey;
}

/// @notice Gas record of the last call, as forge's `lastCallGas` returns it.
struct Gas {
    uint64 gasLimit;
    uint64 gasTotalUsed;
    uint64 gasMemoryUsed;
    int64 gasRefunded;
    uint64 gasRemaining;
}

/// @notice A fuzz-selector target for invariant testing, as forge reads it from `targetSelectors()`.
struct FuzzSelector {
    address addr;
    bytes4[] selectors;
}

/// @title TestBase
/// @notice The suite's own minimal test base: the cheatcode handle, asserts that revert with a message,
///         input bounding, and the invariant-target hooks forge queries on a test contract.
/// @dev Invariant: a failed assertion always reverts, so forge marks the test failed without relying on
///      any `failed()` flag.
abstract contract TestBase {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    /// @notice Marks this contract as a test contract for forge.
    bool public IS_TEST = true;

    event log_named_uint(string key, uint256 val);

    address[] private _targetContracts;
    FuzzSelector[] private _targetSelectors;

    // ------------------------------------------------------------------ invariant hooks

    /// @notice Contracts the invariant fuzzer calls (forge queries this selector).
    function targetContracts() public view returns (address[] memory) {
        return _targetContracts;
    }

    /// @notice Per-contract selectors the invariant fuzzer calls (forge queries this selector).
    function targetSelectors() public view returns (FuzzSelector[] memory) {
        return _targetSelectors;
    }

    function targetContract(address target) internal {
        _targetContracts.push(target);
    }

    function targetSelector(FuzzSelector memory selector) internal {
        _targetSelectors.push(selector);
    }

    // ------------------------------------------------------------------ helpers

    /// @notice Map any x into [lo, hi] (inclusive), keeping small values stable so shrinking works.
    function bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        require(lo <= hi, "bound: lo > hi");
        if (x >= lo && x <= hi) return x;
        uint256 size = hi - lo;
        if (size == type(uint256).max) return x;
        return lo + (x % (size + 1));
    }

    /// @notice A deterministic, labelled address with no code.
    function makeAddr(string memory name) internal returns (address a) {
        a = vm.addr(uint256(keccak256(bytes(name))));
        vm.label(a, name);
    }

    // ------------------------------------------------------------------ asserts

    function assertTrue(bool c, string memory message) internal pure {
        if (!c) revert(message);
    }

    function assertFalse(bool c, string memory message) internal pure {
        if (c) revert(message);
    }

    function assertEq(uint256 a, uint256 b, string memory message) internal pure {
        if (a != b) revert(string.concat(message, ": ", _u(a), " != ", _u(b)));
    }

    function assertEq(address a, address b, string memory message) internal pure {
        if (a != b) revert(string.concat(message, ": ", _h(uint160(a), 20), " != ", _h(uint160(b), 20)));
    }

    function assertEq(bytes32 a, bytes32 b, string memory message) internal pure {
        if (a != b) revert(string.concat(message, ": ", _h(uint256(a), 32), " != ", _h(uint256(b), 32)));
    }

    function assertEq(bool a, bool b, string memory message) internal pure {
        if (a != b) revert(string.concat(message, a ? ": true != false" : ": false != true"));
    }

    function assertEq(bytes memory a, bytes memory b, string memory message) internal pure {
        if (keccak256(a) != keccak256(b)) revert(string.concat(message, ": bytes differ"));
    }

    function assertNotEq(bytes32 a, bytes32 b, string memory message) internal pure {
        if (a == b) revert(string.concat(message, ": both ", _h(uint256(a), 32)));
    }

    function assertNotEq(uint256 a, uint256 b, string memory message) internal pure {
        if (a == b) revert(string.concat(message, ": both ", _u(a)));
    }

    function assertGt(uint256 a, uint256 b, string memory message) internal pure {
        if (a <= b) revert(string.concat(message, ": ", _u(a), " <= ", _u(b)));
    }

    function assertGe(uint256 a, uint256 b, string memory message) internal pure {
        if (a < b) revert(string.concat(message, ": ", _u(a), " < ", _u(b)));
    }

    function assertLt(uint256 a, uint256 b, string memory message) internal pure {
        if (a >= b) revert(string.concat(message, ": ", _u(a), " >= ", _u(b)));
    }

    function assertLe(uint256 a, uint256 b, string memory message) internal pure {
        if (a > b) revert(string.concat(message, ": ", _u(a), " > ", _u(b)));
    }

    // ------------------------------------------------------------------ formatting

    function _u(uint256 v) private pure returns (string memory) {
        if (v == 0) return "0";
        uint256 len;
        for (uint256 t = v; t != 0; t /= 10) {
            ++len;
        }
        bytes memory s = new bytes(len);
        for (; v != 0; v /= 10) {
            s[--len] = bytes1(uint8(48 + (v % 10)));
        }
        return string(s);
    }

    function _h(uint256 v, uint256 byteLen) private pure returns (string memory) {
        bytes memory s = new bytes(2 + 2 * byteLen);
        s[0] = "0";
        s[1] = "x";
        for (uint256 i = 1 + 2 * byteLen; i > 1; --i) {
            s[i] = bytes16("0123456789abcdef")[v & 0xf];
            v >>= 4;
        }
        return string(s);
    }
}
