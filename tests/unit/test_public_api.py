import ast
import importlib
import re
from pathlib import Path

import pytest

import sapo_async
from sapo_async import errors

# Every package whose names load lazily (sapo_async._lazy): its table, its __all__ and its
# TYPE_CHECKING imports list the same names three times, so a test keeps them agreeing.
_ROOT = Path(sapo_async.__file__).parent
FACADES = sorted(
    ".".join(("sapo_async", *init.parent.relative_to(_ROOT).parts))
    for init in _ROOT.rglob("__init__.py")
    if "lazy_exports(" in init.read_text()
)

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


def _type_checking_imports(module) -> dict[str, str]:
    """``{name: "module:attr"}`` for what ``module`` imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse(Path(module.__file__).read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom), ast.unparse(stmt)
                for alias in stmt.names:
                    found[alias.asname or alias.name] = f"{stmt.module}:{alias.name}"
    return found


@pytest.mark.parametrize("package", FACADES)
def test_a_lazy_facade_loads_what_its_type_checking_imports_name_and_exports_all_of_it(package):
    module = importlib.import_module(package)
    table = {
        name: target if ":" in target else f"{target}:{name}"
        for name, target in module._LAZY.items()
    }
    assert table == _type_checking_imports(module)
    assert set(table) <= set(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def test_api_reference_documents_every_public_name() -> None:
    # docs/api.md renders each name with a mkdocstrings directive (`just docs`); a name
    # added to __all__ without one would be public and undocumented.
    page = (_ROOT.parent / "docs" / "api.md").read_text()
    rendered = set(re.findall(r"^::: sapo_async\.(\w+)$", page, flags=re.MULTILINE))
    errors_listed = re.search(r"^::: sapo_async\.errors\n.*?members: \[(.*?)\]", page, re.S | re.M)
    assert errors_listed is not None
    rendered |= {name.strip() for name in errors_listed[1].split(",")}
    missing = set(sapo_async.__all__) - rendered - {"__version__"}
    assert not missing, f"public names missing from docs/api.md: {sorted(missing)}"
    assert "sapo_async.__version__" in page
