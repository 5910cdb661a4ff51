// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @dev The few forge cheatcodes these tests use. The npm `forge-std` is an old copy that needs
/// `ds-test` (not on npm), so the cheatcode interface is declared here instead.
interface Vm {
    function prank(address sender) external;
    function startPrank(address sender) external;
    function stopPrank() external;
    function expectRevert(bytes calldata revertData) external;
    function expectRevert(bytes4 selector) external;
    function expectEmit(bool checkTopic1, bool checkTopic2, bool checkTopic3, bool checkData) external;
    function sign(uint256 privateKey, bytes32 digest) external pure returns (uint8 v, bytes32 r, bytes32 s);
    function addr(uint256 privateKey) external pure returns (address);
    function assume(bool condition) external pure;
    function roll(uint256 blockNumber) external;
    function warp(uint256 timestamp) external;
}

/// @dev Base of the ledger tests: the cheatcode handle plus small assertion helpers.
abstract contract CheatTest {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    error AssertionFailed(string what);

    function assertTrue(bool condition, string memory what) internal pure {
        if (!condition) revert AssertionFailed(what);
    }

    function assertEq(uint256 a, uint256 b, string memory what) internal pure {
        if (a != b) revert AssertionFailed(what);
    }

    function assertEq(bytes32 a, bytes32 b, string memory what) internal pure {
        if (a != b) revert AssertionFailed(what);
    }

    function assertEq(address a, address b, string memory what) internal pure {
        if (a != b) revert AssertionFailed(what);
    }

    /// @dev Maps `x` into `[lo, hi]` (forge-std's `bound`, which we do not have).
    function bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        return lo + (x % (hi - lo + 1));
    }
}
