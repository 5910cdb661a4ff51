"""Start-up checks: which failures wait (outages) and what their messages may show."""

from __future__ import annotations

import pytest

from sapo_async.errors import TransportUnavailable
from sapo_async.ops.doctor import Check
from sapo_async.ops.startup import _waiting_helps, raise_first_failure


def test_an_outage_waits_and_a_setting_does_not():
    assert _waiting_helps(Check("rpc http://127.0.0.1:8545", "fail", "cannot reach the chain"))
    assert _waiting_helps(Check("nats nats://h:4222", "fail", "cannot connect"))
    assert not _waiting_helps(Check("nats nats://h:4222", "fail", "Authorization Violation"))
    assert not _waiting_helps(Check("contract", "fail", "no contract at 0x..."))
    assert not _waiting_helps(Check("chain id", "fail", "the RPC serves chain 1"))


def test_a_failed_check_never_shows_the_password_of_its_url():
    url = "nats://sapo-dev:dev-only-not-a-secret@127.0.0.1:4222"
    with pytest.raises(TransportUnavailable) as info:
        raise_first_failure([Check(f"nats {url}", "fail", f"cannot connect to {url}")])
    assert "dev-only-not-a-secret" not in str(info.value)
    assert "nats://127.0.0.1:4222" in str(info.value)
