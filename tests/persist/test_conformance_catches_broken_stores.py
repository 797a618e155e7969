"""Mutation tests of the store conformance suite: a ``SqliteStore`` with one promise broken must fail it.

``StoreConformance`` (``fsm_agent.testing.stores``) is how a third-party
store's author proves their store keeps the library's promises
(docs/how-to/store.md, section 4).  Each mutant here (``support.broken_stores``)
is a ``SqliteStore`` with one rule broken; the suite is run on it as the guide
says, one import and a ``make_store`` fixture, in a pytest session of its own.

Each is a plain test naming the check that fails the mutant (it holds the
suite to its job).  The mutants the suite once passed (the audit's gaps) each
sit next to a test showing, with a real agent run and a counter in the tool,
the user-visible promise the mutant breaks, and that the real ``SqliteStore``
keeps it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from support.broken_stores import (
    AdecideOverwrites,
    ClaimChecksThenWrites,
    ClaimMovesTheCreation,
    DeleteFinishedTakesUnfinished,
    DeleteLeavesTheRun,
    HeartbeatDoesNotExtend,
    conformance_module,
)

import fsm_agent.pytest_plugin  # imported once here, not inside (and dropped after) an inner session
import fsm_agent.testing.stores  # noqa: F401 - likewise: the inner sessions import it
from fsm_agent import (
    Agent,
    DecisionError,
    RunExistsError,
    RunLeasedError,
    SqliteStore,
    StaleRunError,
    ToolRegistry,
)
from fsm_agent.persist.cursor import RunCursor
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.testing.store_kit import LAPSE, SHORT, Script, race

pytest_plugins = ["pytester"]

SUITE_SIZE = 51
"""Checks the suite runs on a store with every method (none skipped): ``SqliteStore`` and each mutant."""


class SuiteMissedItError(AssertionError):
    """The conformance suite passed a store that breaks a promise: a gap in the suite, named by the failing test."""


def _suite(pytester: pytest.Pytester, mutant: str) -> pytest.RunResult:
    """Run ``StoreConformance`` on the mutant in a pytest session of its own, as its author would."""
    pytester.makepyfile(**{f"test_{mutant}": conformance_module(mutant)})
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-rf", "-p", "no:randomly")


def _fails(pytester: pytest.Pytester, mutant: str) -> pytest.RunResult:
    """The suite's session on ``mutant``, which must fail; ``SuiteMissedItError`` if every check passed."""
    result = _suite(pytester, mutant)
    outcomes = result.parseoutcomes()
    if result.ret == pytest.ExitCode.OK:
        assert outcomes == {"passed": SUITE_SIZE}, outcomes  # the suite ran whole: anything else is no gap
        msg = f"the conformance suite passed {mutant}: {outcomes}"
        raise SuiteMissedItError(msg)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    return result


def _adder(calls: list[tuple[int, int]], wait: Callable[[], None] | None = None) -> ToolRegistry:
    """A registry with ``add``, which counts each call in ``calls``; ``wait`` is called in the first call."""
    tools = ToolRegistry()

    @tools.register
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        calls.append((a, b))
        if wait is not None and len(calls) == 1:
            wait()
        return a + b

    return tools


def _adding(calls: list[tuple[int, int]], wait: Callable[[], None] | None = None, **options: Any) -> Agent:
    """An agent that makes one call ``add(2, 3)`` (id ``c0``) and answers; stateless, so any owner resumes it."""
    return Agent(Script(tool_turn(tool_call("add", id="c0", a=2, b=3)), reply("5")), _adder(calls, wait), **options)


# --- the harness and the mutants the suite catches ----------------------------------------------------------------


@pytest.mark.slow
def test_an_unbroken_sqlite_store_run_this_way_passes_every_check(pytester: pytest.Pytester) -> None:
    """The harness itself: ``SqliteStore`` (as the mutants' base, nothing broken) passes all 51 checks, none skipped."""
    result = _suite(pytester, "Mutant")
    result.assert_outcomes(passed=SUITE_SIZE)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mutant", "caught_by"),
    [
        ("SaveIgnoresTheVersion", "test_claim_and_save_are_compare_and_set_on_the_version_read"),
        ("VersionsIgnoreTheStart", "test_a_version_read_before_a_delete_names_no_version_of_the_run_started_again"),
        ("AppendTakesAnyLaterVersion", "test_append_takes_only_the_next_version_from_the_holder"),
        ("AppendLosesEntries", "test_load_rebuilds_the_run_object_s_snapshot_after_each_write"),
        ("AappendIgnoresTheVersion", "test_each_async_twin_refuses_what_its_sync_method_refuses"),
        ("LoadIsOneWriteBehind", "test_load_rebuilds_the_run_object_s_snapshot_after_each_write"),
        ("LeaseNeverLapses", "test_a_lapsed_lease_is_taken_over_and_the_old_owner_is_then_refused"),
        ("LeaseLapsesAtOnce", "test_a_live_lease_refuses_every_other_owner_naming_the_holder"),
        ("RenewForAnotherOwner", "test_a_live_lease_refuses_every_other_owner_naming_the_holder"),
        ("ReleaseKeepsTheLease", "test_a_release_frees_the_run_at_once"),
        ("DecideOverwrites", "test_decide_records_one_decision_and_refuses_what_it_must"),
        ("CursorRepeatsItsRun", "test_paging_by_cursor_shows_each_run_once_while_runs_are_added_and_saved_again"),
    ],
)
def test_the_suite_fails_a_store_that_breaks_one_promise(
    pytester: pytest.Pytester, mutant: str, caught_by: str
) -> None:
    """Each of these mutants fails the suite, at least in the check of the promise it breaks."""
    result = _fails(pytester, mutant)
    result.stdout.fnmatch_lines([f"FAILED *::TestStore::{caught_by}*"])


# --- a heartbeat that extends nothing -----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_suite_fails_a_store_whose_heartbeat_extends_no_lease(pytester: pytest.Pytester) -> None:
    """``keep`` (and ``akeep``) refuse and accept as they should, but leave the lease where it was.

    The suite keeps a run past the lease it was taken with, and another owner must still be refused.
    """
    result = _fails(pytester, "HeartbeatDoesNotExtend")
    result.stdout.fnmatch_lines(["FAILED *::TestStore::test_keep_moves_the_lease_on_so_a_kept_run_outlives*"])


@pytest.mark.slow
@pytest.mark.parametrize(("store_class", "made"), [(SqliteStore, 1), (HeartbeatDoesNotExtend, 2)])
def test_a_heartbeat_that_extends_nothing_lets_a_second_owner_make_the_call_in_flight_again(
    tmp_path: Path, store_class: type[SqliteStore], made: int
) -> None:
    """A tool call outlasts the lease; the owner's heartbeat must keep its run. With the mutant a second owner
    takes the run over mid-call and makes the call again: ``add`` runs twice."""
    store = store_class(tmp_path / "runs.db", lease=2 * SHORT)  # lapsed within LAPSE unless a heartbeat extends it
    calls: list[tuple[int, int]] = []
    in_flight, let_go = threading.Event(), threading.Event()

    def held() -> None:
        in_flight.set()
        let_go.wait(30)

    first: list[object] = []

    def owner() -> None:
        try:
            first.append(_adding(calls, held).run("add", store=store, run_id="job"))
        except RunLeasedError as refused:
            first.append(refused)

    thread = threading.Thread(target=owner)
    thread.start()
    try:
        assert in_flight.wait(10)
        time.sleep(LAPSE)  # the suite's own wait for a lease to lapse; a live owner's heartbeat keeps it
        try:
            second: object = _adding(calls).resume(store.load("job"), store=store).finish().final
        except RunLeasedError as refused:
            second = refused
    finally:
        let_go.set()
        thread.join(30)
        store.close()
    assert len(calls) == made, (calls, first, second)
    if made == 1:
        assert isinstance(second, RunLeasedError), second
    else:
        assert second == "5"
        assert isinstance(first[0], RunLeasedError), "the first owner's write after its call was refused"


# --- two handles on one store, both claiming ----------------------------------------------------------------------


@pytest.mark.slow
def test_the_suite_fails_a_store_whose_claim_is_atomic_only_within_one_handle(pytester: pytest.Pytester) -> None:
    """``claim`` checks in one transaction and writes in the next, under a lock of the store object only.

    The suite's racers each use a store object of their own (the ``reopen_store`` fixture), as processes do.
    """
    result = _fails(pytester, "ClaimChecksThenWrites")
    result.stdout.fnmatch_lines(["FAILED *::TestStore::test_owners_racing_from_store_objects_of_their_own_*"])


@pytest.mark.parametrize(("store_class", "made"), [(SqliteStore, 1), (ClaimChecksThenWrites, 2)])
def test_a_claim_atomic_per_handle_lets_two_processes_both_resume_a_run_and_make_its_call(
    tmp_path: Path, store_class: type[SqliteStore], made: int
) -> None:
    """A paused run, approved; two processes (a store object each, on one file) resume it at once. One must be
    refused; with the mutant both take the run and each makes the approved call: ``add`` runs twice."""
    path, calls = tmp_path / "runs.db", list[tuple[int, int]]()
    setup = store_class(path)
    assert _adding(calls, approve={"add"}).run("add", store=setup, run_id="job").reason == "paused"
    setup.decide("job", "c0", True)
    setup.close()
    handles = [store_class(path), store_class(path)]
    if isinstance(handles[0], ClaimChecksThenWrites):
        lined_up = threading.Barrier(2, timeout=10)  # both have checked before either writes, as two processes may
        for handle in handles:
            assert isinstance(handle, ClaimChecksThenWrites)
            handle.between = lined_up.wait
    try:
        # Both read the paused run before either claims it.  Had each read inside its thread, a loaded machine could
        # let one finish before the other read, which would then find a finished run: two runs in turn, no race.
        read = [handle.load("job") for handle in handles]
        outcomes = race([partial(_resumed, calls, handle, run) for handle, run in zip(handles, read, strict=True)])
    finally:
        for handle in handles:
            handle.close()
    assert len(calls) == made, (calls, outcomes)
    if made == 1:  # the loser is refused: the winner holds the lease, or has already moved the run on
        assert sum(isinstance(o, RunLeasedError | StaleRunError) for o in outcomes) == 1, outcomes


def _resumed(calls: list[tuple[int, int]], store: SqliteStore, run: dict[str, Any]) -> object:
    """Resume ``run``, as read from ``store``, in a new agent, to its end."""
    return _adding(calls).resume(run, store=store).finish()


# --- an async decide that overrules a decision --------------------------------------------------------------------


@pytest.mark.slow
def test_the_suite_fails_a_store_whose_adecide_overrules_a_decision(pytester: pytest.Pytester) -> None:
    """``adecide`` replaces a decision already taken on a call; ``decide`` refuses, as it should.

    The suite awaits ``adecide`` with the refusals it checks of ``decide``.
    """
    result = _fails(pytester, "AdecideOverwrites")
    result.stdout.fnmatch_lines(["FAILED *::TestStore::test_adecide_records_one_decision_and_refuses_what_decide_*"])


@pytest.mark.parametrize(("store_class", "made"), [(SqliteStore, 0), (AdecideOverwrites, 1)])
def test_an_adecide_that_overrules_runs_a_call_a_person_rejected(
    tmp_path: Path, store_class: type[SqliteStore], made: int
) -> None:
    """Two people decide on one held-back call from an async web handler: the first rejects it, the second
    approves it. The second must be refused; with the mutant the rejected call runs on resume."""
    store, calls = store_class(tmp_path / "runs.db"), list[tuple[int, int]]()
    agent = _adding(calls, approve={"add"})
    assert agent.run("add", store=store, run_id="job").reason == "paused"

    async def two_people() -> list[object]:
        said: list[object] = []
        for decision in ("not now", True):
            try:
                said.append((await store.adecide("job", "c0", decision))["approvals"])
            except DecisionError as refused:
                said.append(refused)
        await store.aclose()
        return said

    said = asyncio.run(two_people())
    agent.resume(store.load("job"), store=store).finish()
    store.close()
    assert len(calls) == made, (calls, said)
    assert said[0] == {"c0": "not now"}
    assert isinstance(said[1], DecisionError) == (made == 0), said


# --- a resume that moves the run in the creation order ------------------------------------------------------------


@pytest.mark.slow
def test_the_suite_fails_a_store_whose_claim_moves_the_run_s_creation(pytester: pytest.Pytester) -> None:
    """A claim stamps the run as created anew; save and append keep its creation, as the checks look at.

    The suite's paging check claims (resumes) a run not yet shown between two pages, besides saving others.
    """
    result = _fails(pytester, "ClaimMovesTheCreation")
    result.stdout.fnmatch_lines(["FAILED *::TestStore::test_paging_by_cursor_shows_each_run_once_*"])


@pytest.mark.parametrize(("store_class", "skipped"), [(SqliteStore, []), (ClaimMovesTheCreation, ["r1"])])
def test_a_claim_that_moves_the_creation_makes_paging_skip_a_run_resumed_between_pages(
    tmp_path: Path, store_class: type[SqliteStore], skipped: list[str]
) -> None:
    """Five paused runs paged two at a time by cursor (the run viewer's "older" link); between the first two
    pages a person approves r1 and it is resumed. Every run must be on one page; with the mutant r1 is on none."""
    store, calls = store_class(tmp_path / "runs.db"), list[tuple[int, int]]()
    agent = _adding(calls, approve={"add"})
    names = [f"r{i}" for i in range(5)]
    for run_id in names:
        assert agent.run("add", store=store, run_id=run_id).reason == "paused"
    pages = [store.list_runs(order="created", limit=2)]
    store.decide("r1", "c0", True)
    assert agent.resume(store.load("r1"), store=store).finish().final == "5"
    while pages[-1]:
        pages.append(store.list_runs(order="created", limit=2, after=RunCursor.of(pages[-1][-1])))
    store.close()
    shown = [run.run_id for page in pages for run in page]
    assert calls == [(2, 3)]
    assert sorted(set(names) - set(shown)) == skipped, shown
    assert len(shown) == len(set(shown)), shown


# --- deletion ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_suite_fails_a_store_whose_delete_leaves_the_run(pytester: pytest.Pytester) -> None:
    """``delete`` drops the journal and says the run was there, but leaves its row (base, version, lease).

    The suite deletes a run and then loads, lists and creates it again.
    """
    result = _fails(pytester, "DeleteLeavesTheRun")
    result.stdout.fnmatch_lines(["FAILED *::TestStore::test_delete_forgets_the_run_its_journal_and_its_lease_*"])


@pytest.mark.parametrize(("store_class", "made"), [(SqliteStore, 2), (DeleteLeavesTheRun, 1)])
def test_a_delete_that_leaves_the_run_keeps_a_deleted_run_listed_and_its_id_taken(
    tmp_path: Path, store_class: type[SqliteStore], made: int
) -> None:
    """A finished run is deleted "to ask it afresh" (what run_batch's refusal tells the user to do); asked again,
    it must run. With the mutant the deleted run is still listed and asking again is RunExistsError."""
    store, calls = store_class(tmp_path / "runs.db"), list[tuple[int, int]]()
    assert _adding(calls).run("add", store=store, run_id="job").final == "5"
    assert store.delete("job") is True
    listed = [run.run_id for run in store.list_runs()]
    try:
        again: object = _adding(calls).run("add", store=store, run_id="job").final
    except RunExistsError as refused:
        again = refused
    store.close()
    assert len(calls) == made, (calls, again)
    assert listed == ([] if made == 2 else ["job"])
    assert (again == "5") == (made == 2), again


@pytest.mark.slow
def test_the_suite_fails_a_store_whose_delete_finished_takes_unfinished_runs(pytester: pytest.Pytester) -> None:
    """``delete_finished`` forgets every run old enough, whatever its state.

    The suite stores a paused and a running run beside the finished ones, and both must stay.
    """
    result = _fails(pytester, "DeleteFinishedTakesUnfinished")
    result.stdout.fnmatch_lines(["FAILED *::TestStore::test_delete_finished_forgets_the_done_and_failed_runs_only*"])


@pytest.mark.parametrize(("store_class", "made"), [(SqliteStore, 1), (DeleteFinishedTakesUnfinished, 0)])
def test_a_delete_finished_that_takes_unfinished_runs_loses_a_paused_run_and_its_decision(
    tmp_path: Path, store_class: type[SqliteStore], made: int
) -> None:
    """``runs prune`` (``delete_finished``) beside a run paused for approval: the paused run must stay, be
    approved and resumed. With the mutant it is gone: the decision is a KeyError and the call is never made."""
    store, calls = store_class(tmp_path / "runs.db"), list[tuple[int, int]]()
    agent = _adding(calls, approve={"add"})
    assert _adding([]).run("add", store=store, run_id="done").final == "5"
    assert agent.run("add", store=store, run_id="paused").reason == "paused"
    pruned = store.delete_finished()
    try:
        store.decide("paused", "c0", True)
        agent.resume(store.load("paused"), store=store).finish()
    except KeyError as gone:
        pruned_too: object = gone
    else:
        pruned_too = None
    store.close()
    assert len(calls) == made, (calls, pruned, pruned_too)
    assert pruned == 2 - made
    assert (pruned_too is None) == (made == 1)
