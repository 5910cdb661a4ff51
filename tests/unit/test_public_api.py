import sapo_async
from sapo_async import errors

# The public names users rely on; removing one is a breaking change.
EXPECTED_PUBLIC = {
    "ActorError",
    "ActorFailed",
    "ActorStopped",
    "CheckpointError",
    "CommitmentRejected",
    "Completion",
    "ConfigError",
    "GenerationError",
    "LedgerError",
    "LedgerUnavailable",
    "Node",
    "PublishError",
    "RejectedInput",
    "RolloutGroup",
    "RoundReport",
    "SamplingParams",
    "SapoError",
    "SignedGroup",
    "Swarm",
    "TaskRef",
    "TrainingError",
    "TransportError",
    "TransportUnavailable",
    "WeightSyncError",
    "__version__",
    "Collector",
    "NodeConfig",
    "NodeSpec",
    "load_config",
    "audit_swarm",
    "verify_rollout",
    "select_backend",
    "build_learner",
}


def test_public_names_are_all_exported_and_sorted():
    assert set(sapo_async.__all__) >= EXPECTED_PUBLIC
    assert list(sapo_async.__all__) == sorted(sapo_async.__all__)
    for name in sapo_async.__all__:
        assert hasattr(sapo_async, name), name


def test_every_error_derives_from_sapo_error_and_builtins_where_they_fit():
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.SapoError)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.RejectedInput, ValueError)
    assert issubclass(errors.TransportUnavailable, ConnectionError)
    assert issubclass(errors.LedgerUnavailable, ConnectionError)
    assert issubclass(errors.IdentityError, errors.ConfigError)
    assert issubclass(errors.PublishRefused, errors.PublishError)
    assert issubclass(errors.PublishError, errors.TransportError)
    err = errors.RejectedInput("bad_signature", "signer differs", producer="0xabc")
    assert err.reason == "bad_signature"
    assert "signer differs" in str(err)
