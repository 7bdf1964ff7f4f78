"""The runtime contract (umemc/contract.py): what one process writes, the other reads, typed and
versioned; a file from another version, or a damaged one, is a clear error naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.contract import ContractError, EnforcerStatus, PlanDoc, WorkerStatus, dump, parse, read
from umemc.stack.resolve import load_stack


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("contract") / "bundle"
    build(make_plan(load_stack(REPO / "examples/small-16g.toml")), out)
    return out


def test_plan_round_trips_byte_for_byte(bundle: Path) -> None:
    text = (bundle / "plan.json").read_text()
    plan = read(PlanDoc, bundle / "plan.json")
    assert dump(plan, indent=2) + "\n" == text
    assert (plan.stack, plan.models["chat"].mode, plan.policy.kernel_enforcement) == ("small-16g", "hot", "auto")


def test_another_version_is_a_clear_error(bundle: Path, tmp_path: Path) -> None:
    doc = json.loads((bundle / "plan.json").read_text())
    doc["version"] = 2
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(ContractError) as err:
        read(PlanDoc, tmp_path / "plan.json")
    assert str(err.value) == (
        f"{tmp_path}/plan.json: umemc-plan version 2, but this umemc reads version 1: it was written by another "
        "umemc; rebuild it with this one (`umemc up STACK` rebuilds the bundle)"
    )


def test_a_missing_field_names_the_field(bundle: Path) -> None:
    doc = json.loads((bundle / "plan.json").read_text())
    del doc["models"]["chat"]["quota_hard_bytes"]
    with pytest.raises(ContractError) as err:
        parse(PlanDoc, json.dumps(doc), "plan.json")
    assert str(err.value) == "plan.json: umemc-plan field models.chat.quota_hard_bytes: Field required"


@pytest.mark.parametrize(
    "where,value,message",
    [
        (("models", "chat", "estimate_parts", "kv_bytes"), "1", "models.chat.estimate_parts.kv_bytes: Expected `int`, "
         "got `str`"),
        (("models", "chat", "argv", 1), 5, "models.chat.argv.1: Expected `str`, got `int`"),
        (("models", "chat", "bogus"), 1, "models.chat.bogus: Not a field of this document"),
        (("models", "chat", "env", "HOME"), None, "models.chat.env.HOME: Expected `str`, got `null`"),
        (("policy", "kernel_enforcement"), "sometimes", "policy.kernel_enforcement: Invalid enum value 'sometimes'"),
    ],
)  # fmt: skip
def test_a_wrong_value_names_its_field_tables_keys_included(
    bundle: Path, where: tuple[str | int, ...], value: object, message: str
) -> None:
    """msgspec says a table's entry as `[...]`: the entry's key is found and said."""
    doc = json.loads((bundle / "plan.json").read_text())
    parent = doc
    for step in where[:-1]:
        parent = parent[step]
    parent[where[-1]] = value
    with pytest.raises(ContractError) as err:
        parse(PlanDoc, json.dumps(doc), "plan.json")
    assert str(err.value) == f"plan.json: umemc-plan field {message}"


@pytest.mark.parametrize(
    "text,message",
    [
        ("{", "x.json: not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        ('{"format": "umemc-gateway-state", "version": 1}', "x.json: not a umemc-plan file"),
        ("[]", "x.json: not a umemc-plan file"),
    ],
)
def test_damaged_files(text: str, message: str) -> None:
    with pytest.raises(ContractError) as err:
        parse(PlanDoc, text, "x.json")
    assert str(err.value) == message


def test_live_status_round_trips() -> None:
    status = EnforcerStatus(
        time=1.5,
        pid=7,
        pressure=0.25,
        events_error=None,
        events_moved_to=None,
        models={
            "w": WorkerStatus(
                pid=9,
                rss_bytes=1,
                gpu_bytes=2,
                peak_bytes=3,
                restarts=0,
                started=1.0,
                last_event="start",
                given_up=False,
                drift=None,
                reserved_bytes=0,
            )
        },
    )
    text = dump(status)
    assert json.loads(text)["format"] == "umemc-enforcer-status"
    assert parse(EnforcerStatus, text, "enforcer.json") == status


@pytest.mark.parametrize("golden", sorted(str(p.relative_to(REPO)) for p in (REPO / "tests/golden").rglob("plan.json")))
def test_a_document_read_straight_is_what_the_whole_read_makes(golden: str) -> None:
    """parse() reads a usual file straight into its document (msgspec's typed decoder); each golden bundle's plan,
    and a plan whose duplicate key only Python's parser and msgspec's each take the last of, come out equal to the
    document the JSON values make (json's parser, then msgspec's conversion)."""
    import msgspec

    text = (REPO / golden).read_text()
    assert parse(PlanDoc, text, "plan.json") == msgspec.convert(json.loads(text), PlanDoc)
    twice = text.replace('"stack": ', '"stack": "first", "stack": ', 1)
    assert twice != text
    assert parse(PlanDoc, twice, "plan.json") == msgspec.convert(json.loads(twice), PlanDoc)


def test_enforcer_refuses_a_plan_of_another_version(bundle: Path, tmp_path: Path) -> None:
    from umemc.runtime.enforcer.loop import Enforcer

    other = tmp_path / "bundle"
    other.mkdir()
    doc = json.loads((bundle / "plan.json").read_text())
    doc["version"] = 0
    (other / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(ContractError, match=r"umemc-plan version 0, but this umemc reads version 1"):
        Enforcer(other)


def test_a_plan_from_before_the_newer_fields_still_reads(bundle: Path) -> None:
    """umemc upgraded under a running stack: the enforcer restarts on the new code with the old plan."""
    doc = json.loads((bundle / "plan.json").read_text())
    for key in ("needs_model_file", "pinned_flags", "help_argv", "reports_buffers"):
        for m in doc["models"].values():
            del m[key]
    for key in (
        "max_body_bytes",
        "header_timeout_s",
        "body_timeout_s",
        "upstream_timeout_s",
        "health_interval_s",
        "memory_bytes",
    ):
        del doc["gateway"][key]
    plan = parse(PlanDoc, json.dumps(doc), "plan.json")
    assert (plan.models["chat"].pinned_flags, plan.gateway and plan.gateway.header_timeout_s) == ([], 15.0)


def test_a_document_is_written_only_as_it_reads_back() -> None:
    """A struct is not checked when it is built: dump checks it, so a writer's float where the contract says an
    integer fails at the writer, naming the field, and a right one is written."""
    from umemc.contract import Reservation, WorkerReport, dump

    bad = WorkerReport(
        model="m", pid=1, reserved_bytes=10, hard_bytes=20, reservations=[Reservation(what="kv", bytes=1.5)]
    )  # type: ignore[arg-type]
    with pytest.raises(ValueError) as err:
        dump(bad)
    assert str(err.value) == "WorkerReport: field reservations.0.bytes: Expected `int`, got `float`"
    good = WorkerReport(
        model="m", pid=1, reserved_bytes=10, hard_bytes=20, reservations=[Reservation(what="kv", bytes=2)]
    )
    assert json.loads(dump(good))["reservations"] == [{"what": "kv", "bytes": 2}]


def test_an_error_path_no_document_has_is_said_as_msgspec_says_it() -> None:
    """Where the keys of an error's path cannot be found (no such field, or no path at all), the message keeps
    msgspec's own words rather than failing while it reports."""
    import msgspec

    from umemc.document import located

    odd = msgspec.ValidationError("Expected `int`, got `str` - at `$.nowhere[...].x`")
    assert located(PlanDoc, {}, odd) == ("nowhere[...].x", "Expected `int`, got `str`")
    whole = msgspec.ValidationError("Expected `object`, got `array`")
    assert located(PlanDoc, [], whole) == ("(the document)", "Expected `object`, got `array`")
