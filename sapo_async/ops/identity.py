"""A node's identity: one secp256k1 key in an encrypted Ethereum keystore.

Owns creating the keystore on first run (eth-account, scrypt KDF), finding its password
(environment variable, then password file, then an interactive prompt) and decrypting it.
The key's Ethereum address is the node's identity everywhere: it signs rollouts, and the
ledger records commitments under it.

Does not know what the key signs. Invariants: the key never touches disk unencrypted; a
keystore is written atomically with mode 0600, and an existing keystore is never
overwritten; a wrong or missing password is an :class:`~sapo_async.errors.IdentityError`
saying what to do.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapo_async.errors import IdentityError
from sapo_async.limits import KEYSTORE_SCRYPT_N
from sapo_async.logs import get_logger

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from sapo_async.ops.config import NodeConfig

__all__ = ["load_or_create_identity", "resolve_password"]


_log = get_logger("identity")


PasswordPrompt = Callable[[str], str]
"""Asks the user for a secret (``getpass.getpass`` by default)."""


def _default_prompt(text: str) -> str:
    return getpass.getpass(text)


def resolve_password(
    cfg: NodeConfig,
    *,
    creating: bool,
    prompt: PasswordPrompt | None = None,
    interactive: bool | None = None,
) -> str:
    """Find the keystore password: env var, then password file, then a prompt.

    Args:
        cfg: the node config (``identity.password_env``, ``identity.password_file``).
        creating: the keystore is new, so a prompt asks twice and compares.
        prompt: asks for a secret; defaults to ``getpass.getpass``.
        interactive: whether prompting is allowed; by default only when stdin is a TTY.

    Returns:
        The password (never empty).

    Raises:
        IdentityError: no source gave a password, the file is unreadable or empty, or
            the two prompted entries differ.
    """
    ident = cfg.identity
    from_env = os.environ.get(ident.password_env)
    if from_env:
        return from_env
    if ident.password_file is not None:
        try:
            lines = ident.password_file.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise IdentityError(
                f"cannot read identity.password_file {ident.password_file}: {exc}",
                field="identity.password_file",
            ) from exc
        password = lines[0] if lines else ""
        if not password:
            raise IdentityError(
                f"identity.password_file {ident.password_file} is empty; put the keystore "
                "password on its first line",
                field="identity.password_file",
            )
        return password
    if interactive is None:
        interactive = sys.stdin is not None and sys.stdin.isatty()
    if not interactive:
        raise IdentityError(
            f"no keystore password: set the environment variable {ident.password_env}, or "
            "identity.password_file in node.toml, or run on a terminal to be prompted",
            field="identity.password_env",
        )
    ask = prompt or _default_prompt
    action = "new" if creating else "the"
    password = ask(f"Password for {action} node keystore {cfg.keystore_path}: ")
    if not password:
        raise IdentityError("an empty keystore password is not allowed", field="identity")
    if creating and ask("Repeat the password: ") != password:
        raise IdentityError("the two passwords differ; nothing was written", field="identity")
    return password


def _write_keystore(path: Path, keystore: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # 0600 from the start: the file is encrypted, but nobody else needs to read it.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(keystore, fh)
        fh.flush()
        os.fsync(fh.fileno())
    # link() fails if a keystore appeared meanwhile: never replace someone's key.
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink()


_DAMAGED_ADVICE = (
    "nothing was changed: restore it from your backup; without one, move it aside and run "
    "`sapo-async identity` for a new key (a new address: what the old one earned stays "
    "with the old one)"
)

_KEYSTORE_FIELDS = ("cipher", "cipherparams", "ciphertext", "kdf", "kdfparams", "mac")


def _read_keystore(path: Path) -> dict[str, Any]:
    """Read a keystore and check its shape, before anyone is asked for a password.

    Raises:
        IdentityError: unreadable, not JSON, or not a version-3 Ethereum key file.
    """
    try:
        keystore = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise IdentityError(
            f"cannot read keystore {path}: {exc}", field="identity.keystore"
        ) from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise IdentityError(
            f"keystore {path} is damaged (not JSON: {exc}); {_DAMAGED_ADVICE}",
            field="identity.keystore",
        ) from exc
    if not isinstance(keystore, dict):
        raise IdentityError(
            f"keystore {path} is not an encrypted Ethereum key file (a JSON "
            f"{type(keystore).__name__}, not an object); {_DAMAGED_ADVICE}",
            field="identity.keystore",
        )
    checked: dict[str, Any] = keystore
    crypto = checked.get("crypto", checked.get("Crypto"))
    missing = [f for f in _KEYSTORE_FIELDS if not isinstance(crypto, dict) or f not in crypto]
    version = checked.get("version")
    if version != 3 or missing:
        problem = f"version {version!r}, not 3" if version != 3 else f"no {', '.join(missing)}"
        raise IdentityError(
            f"keystore {path} is not an encrypted Ethereum key file ({problem}); {_DAMAGED_ADVICE}",
            field="identity.keystore",
        )
    return checked


def load_or_create_identity(
    cfg: NodeConfig,
    *,
    prompt: PasswordPrompt | None = None,
    interactive: bool | None = None,
    scrypt_n: int = KEYSTORE_SCRYPT_N,
) -> LocalAccount:
    """Open the node's keystore, creating a new key in it on first run.

    Args:
        cfg: the node config (keystore path and password sources).
        prompt: asks for the password when no env var or file gives it.
        interactive: whether prompting is allowed (default: stdin is a TTY).
        scrypt_n: scrypt cost for a *new* keystore (a power of two); opening reads the
            cost from the file. Tests pass a small value.

    Returns:
        The decrypted account; ``account.address`` is the node's identity.

    Raises:
        IdentityError: no password, wrong password, or a keystore that is not a valid
            encrypted Ethereum key file.
    """
    # eth-account pulls in half of web3's stack; only a starting node needs it.
    from eth_account import Account

    path = cfg.keystore_path
    if path.exists():
        keystore = _read_keystore(path)
        password = resolve_password(cfg, creating=False, prompt=prompt, interactive=interactive)
        try:
            key = Account.decrypt(keystore, password)
        except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
            # eth-keyfile says "MAC mismatch" when the derived key does not fit the file.
            if "MAC mismatch" in str(exc):
                raise IdentityError(
                    f"wrong password for keystore {path} (or the file was altered): check "
                    f"${cfg.identity.password_env} or identity.password_file; the keystore "
                    "is unchanged",
                    field="identity.keystore",
                ) from exc
            raise IdentityError(
                f"keystore {path} is damaged ({type(exc).__name__}: {exc}); {_DAMAGED_ADVICE}",
                field="identity.keystore",
            ) from exc
        account: LocalAccount = Account.from_key(key)
        _log.info("identity_loaded", address=account.address, keystore=str(path))
        return account
    password = resolve_password(cfg, creating=True, prompt=prompt, interactive=interactive)
    account = Account.create()
    keystore = Account.encrypt(account.key, password, kdf="scrypt", iterations=scrypt_n)
    try:
        _write_keystore(path, keystore)
    except FileExistsError:
        # Another process created it between our check and our write: use theirs.
        return load_or_create_identity(
            cfg, prompt=prompt, interactive=interactive, scrypt_n=scrypt_n
        )
    except OSError as exc:
        raise IdentityError(
            f"cannot write keystore {path}: {exc}", field="identity.keystore"
        ) from exc
    _log.info("identity_created", address=account.address, keystore=str(path))
    return account
