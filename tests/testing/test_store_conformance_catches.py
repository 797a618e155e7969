"""The conformance suite judged as a test of stores: a store written from the docs passes it, a broken one fails it.

Each test writes a test module that subclasses ``StoreConformance`` for one
store and runs it in a pytest session of its own (``pytester``), as a
third-party project would run it.  The store is ``MemoryStore``, taken
verbatim from the guide (docs/how-to/store.md, section 2), plus a ``decide``
and a ``list_runs`` written from the ``FullStore`` protocol; each broken store
breaks one rule of the contract in a subclass, and the suite must fail on it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fsm_agent.pytest_plugin  # imported once here, not inside (and dropped after) an inner session
import fsm_agent.testing.stores  # noqa: F401 - likewise: the inner sessions import it

pytest_plugins = ["pytester"]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "store.md"


def _guide_store() -> str:
    """The source of ``memory_store.py`` as the guide prints it."""
    found = re.search(r'```python title="memory_store.py"\n(.*?)```', GUIDE.read_text(encoding="utf-8"), re.S)
    assert found is not None, "the guide no longer prints memory_store.py"
    return found.group(1)


# A decide() written from the FullStore protocol's docstring: one locked transaction, refused by rule.
DECIDING = '''
class DecidingStore(MemoryStore):
    """MemoryStore with decide(), one transaction under the store's (now reentrant) lock."""

    def __init__(self, lease=12.0):
        super().__init__(lease)
        self.lock = threading.RLock()

    def decide(self, run_id, call_id, decision):
        if not isinstance(decision, bool | str):
            raise TypeError(f"a decision is True, False or a reason text, got {decision!r}")
        with self.lock:
            data = self.load(run_id)
            run = self.runs[run_id]
            if run["owner"] is not None and run["until"] >= time.time():
                raise RunLeasedError(run_id, run["owner"], run["until"])
            if self._check_decision(run_id, data, call_id, decision):
                return data  # the same decision again: taken as given, nothing written
            return self._decided(run_id, data, call_id, decision)

    def _check_decision(self, run_id, data, call_id, decision):
        pending = [call["id"] for call in data.get("pending") or []]
        if not data.get("paused"):
            raise DecisionError(run_id, call_id, "the run is not paused")
        if call_id not in pending or call_id in (data.get("ran") or {}):
            raise DecisionError(run_id, call_id, "not a pending call")
        approvals = data.get("approvals") or {}
        decision = decision if decision != "" else False  # False and "" are one decision
        if call_id in approvals:
            stored = approvals[call_id] if approvals[call_id] != "" else False
            if type(stored) is type(decision) and stored == decision:
                return True
            raise DecisionError(run_id, call_id, "already decided")
        if call_id not in data.get("to_approve", pending):
            raise DecisionError(run_id, call_id, "it needs no approval")
        return False

    def _decided(self, run_id, data, call_id, decision):
        with self.lock:
            run = self.runs[run_id]
            changed = {"approvals": {**(data.get("approvals") or {}), call_id: decision}}
            run["journal"].append(json.dumps({"set": changed}))
            run["seq"] += 1
            data.update(changed)
            data["stored_seq"] = run["seq"]
            return data
'''

# A list_runs written from the FullStore protocol: by last save, or by creation from a cursor, with the same checks.
LISTING = '''
from fsm_agent.persist.checks import epoch, filter_text, page
from fsm_agent.persist.cursor import check_listing
from fsm_agent.persist.summary import StoredRun, Summary


def _field(run, name):
    """What a filter compares: the run's field, or for parent the run its link names."""
    return (run.parent or (None,))[0] if name == "parent" else getattr(run, name)


class ListingStore(DecidingStore):
    """DecidingStore with list_runs: each run's creation time set once, its last save at every write."""

    def _put(self, run_id, snapshot, owner, seq):
        known = self.runs.get(run_id)
        seq = super()._put(run_id, snapshot, owner, seq)
        now = time.time()
        self.runs[run_id].update(created=known["created"] if known else now, updated=now)
        return seq

    def append(self, entry, *, owner):
        with self.lock:
            super().append(entry, owner=owner)
            self.runs[entry.run_id]["updated"] = time.time()

    def _decided(self, run_id, data, call_id, decision):
        with self.lock:
            self.runs[run_id]["updated"] = time.time()
            return super()._decided(run_id, data, call_id, decision)

    def list_runs(self, *, state=None, reason=None, since=None, limit=None, offset=0, session=None,
                  order="updated", after=None, parent=None):
        size, skip = page(limit, offset)
        order, after = check_listing(order, after, skip)
        wanted = {"state": filter_text("state", state), "reason": filter_text("reason", reason),
                  "session": filter_text("session", session), "parent": filter_text("parent", parent)}
        since = epoch(since)
        with self.lock:
            listed = [self._listed(run_id) for run_id in self.runs]
        listed = [r for r in listed if all(v is None or _field(r, k) == v for k, v in wanted.items())]
        listed = [r for r in listed if since is None or r.updated >= since]
        listed = self._ordered(listed, order, after)
        return listed[skip:None if size < 0 else skip + size]

    def _listed(self, run_id):
        summary, run = Summary.of(self.load(run_id)), self.runs[run_id]
        return StoredRun(run_id, summary.state, summary.reason, summary.paused, run["updated"], summary.steps,
                         summary.tokens, summary.session, summary.forked_from, run["created"], summary.parent)

    def _ordered(self, listed, order, after):
        if order == "updated":
            return sorted(listed, key=lambda r: (-r.updated, r.run_id))
        listed = sorted(listed, key=lambda r: (r.created, r.run_id), reverse=True)
        return [r for r in listed if after is None or (r.created, r.run_id) < (after.created, after.run_id)]
'''

LISTING_BROKEN = {
    "save_moves_the_creation": '''
class Broken(ListingStore):
    """A run saved again is stamped created anew, so it leaves its place in the creation order."""

    def _put(self, run_id, snapshot, owner, seq):
        seq = super()._put(run_id, snapshot, owner, seq)
        self.runs[run_id]["created"] = time.time()
        return seq
''',
    "after_counts_positions_by_last_save": '''
class Broken(ListingStore):
    """after is taken as "the runs past the cursor's run" in the list by last save, read anew at each page."""

    def _ordered(self, listed, order, after):
        listed = sorted(listed, key=lambda r: (-r.updated, r.run_id))
        ids = [r.run_id for r in listed]
        start = ids.index(after.run_id) + 1 if after is not None and after.run_id in ids else 0
        return listed[start:]
''',
    "ties_by_run_id_ascending": '''
class Broken(ListingStore):
    """Runs created at the same moment come in ascending run id, and the cursor compares that way."""

    def _ordered(self, listed, order, after):
        if order == "updated":
            return super()._ordered(listed, order, after)
        listed = sorted(listed, key=lambda r: (-r.created, r.run_id))
        return [r for r in listed if after is None or (-r.created, r.run_id) > (-after.created, after.run_id)]
''',
}
"""Stores whose list_runs breaks one rule of paging by cursor, and must each fail the suite."""

BROKEN = {
    "append_ignores_the_version": '''
class Broken(DecidingStore):
    """append checks the lease but not that the run is at entry.seq - 1."""

    def append(self, entry, *, owner):
        with self.lock:
            if entry.run_id not in self.runs:
                raise KeyError(entry.run_id)
            self._holdable(entry.run_id, owner)
            run = self.runs[entry.run_id]
            run["journal"].append(entry.text)
            run["seq"] = entry.seq
            self._lease(run, None if entry.release else owner)
''',
    "two_owners_hold_the_lease": '''
class Broken(DecidingStore):
    """A live lease refuses nobody: any owner may take and write a run another owner holds."""

    def _holdable(self, run_id, owner):
        return self.runs[run_id]["seq"]
''',
    "decide_loses_a_concurrent_decision": '''
class Broken(DecidingStore):
    """decide reads the run, lets go of the lock, then writes its decision over what it read."""

    def __init__(self, lease=12.0):
        super().__init__(lease)
        self.both_read = threading.Barrier(2, timeout=0.5)

    def decide(self, run_id, call_id, decision):
        with self.lock:
            data = self.load(run_id)
            run = self.runs[run_id]
            if run["owner"] is not None and run["until"] >= time.time():
                raise RunLeasedError(run_id, run["owner"], run["until"])
            self._check_decision(run_id, data, call_id)
        try:
            self.both_read.wait()  # two people deciding at once have both read before either writes
        except threading.BrokenBarrierError:
            self.both_read.reset()  # one person alone
        return self._decided(run_id, data, call_id, decision)
''',
    "append_drops_entries": '''
class Broken(DecidingStore):
    """append takes each version but keeps only the entries of even versions."""

    def append(self, entry, *, owner):
        with self.lock:
            run = self._fenced(entry.run_id, owner, entry.seq - 1)
            if entry.seq % 2 == 0:
                run["journal"].append(entry.text)
            run["seq"] = entry.seq
            self._lease(run, None if entry.release else owner)
''',
    "renew_ignores_the_version": '''
class Broken(DecidingStore):
    """renew checks the lease but not that the run is still at the version the owner names."""

    def renew(self, run_id, *, owner, seq, release=False):
        with self.lock:
            if run_id not in self.runs:
                raise KeyError(run_id)
            self._holdable(run_id, owner)
            self._lease(self.runs[run_id], None if release else owner)
''',
    "akeep_takes_a_run_back": '''
class Broken(DecidingStore):
    """The async twin of keep renews like renew: a released run is taken back, at any version."""

    async def akeep(self, run_id, *, owner, seq):
        with self.lock:
            self._holdable(run_id, owner)
            self._lease(self.runs[run_id], owner)
''',
    "asave_is_no_compare_and_set": '''
class Broken(DecidingStore):
    """The async twin of save writes the snapshot over whatever is stored, at any version, leased or not."""

    async def asave(self, run_id, snapshot):
        check_snapshot(snapshot)
        with self.lock:
            seq = self.runs[run_id]["seq"] + 1 if run_id in self.runs else 1
            return self._put(run_id, snapshot, None, seq)
''',
}
"""Stores that each break one rule of the contract, and must each fail the suite."""

SUITE = """
from fsm_agent import DecisionError
from fsm_agent.testing.stores import StoreConformance


class TestStore(StoreConformance):
    @pytest.fixture
    def make_store(self):
        return lambda lease: {cls}(lease=lease)
"""


def _session(pytester: pytest.Pytester, name: str, *sources: str, cls: str) -> pytest.RunResult:
    """Run the conformance suite on ``cls`` (defined by ``sources`` after the guide's store) in a session of its own."""
    module = "import pytest\n" + _guide_store() + "".join(sources) + SUITE.format(cls=cls)
    pytester.makepyfile(**{f"test_{name}": module})
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-rfs", "-p", "no:randomly")


@pytest.mark.slow
def test_the_guide_s_memory_store_passes_the_suite_as_the_guide_says(pytester: pytest.Pytester) -> None:
    """MemoryStore, verbatim from the guide, subclassed as section 4 shows: 24 passed, 27 skipped, exit code 0."""
    result = _session(pytester, "guide", cls="MemoryStore")
    result.assert_outcomes(passed=24, skipped=27)
    assert result.ret == 0


@pytest.mark.slow
def test_a_store_with_decide_written_from_the_protocol_passes_the_decide_checks(pytester: pytest.Pytester) -> None:
    """The guide's store plus a decide() as FullStore describes it: the four decide checks run, and pass."""
    result = _session(pytester, "deciding", DECIDING, cls="DecidingStore")
    result.assert_outcomes(passed=28, skipped=23)


@pytest.mark.slow
def test_a_store_with_list_runs_written_from_the_protocol_passes_the_listing_checks(
    pytester: pytest.Pytester,
) -> None:
    """Plus a list_runs() as FullStore describes it: the eight listing checks run (three page by cursor), and pass."""
    result = _session(pytester, "listing", DECIDING, LISTING, cls="ListingStore")
    result.assert_outcomes(passed=39, skipped=12)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broken", "caught_by"),
    [
        ("save_moves_the_creation", "test_paging_by_cursor_shows_each_run_once_while_runs_are_added_and_saved_again"),
        (
            "after_counts_positions_by_last_save",
            "test_paging_by_cursor_shows_each_run_once_while_runs_are_added_and_saved_again",
        ),
        (
            "ties_by_run_id_ascending",
            "test_the_creation_order_is_latest_first_ties_by_run_id_descending_and_a_cursor_excludes_its_run",
        ),
    ],
)
def test_a_store_that_pages_runs_otherwise_fails_the_listing_checks(
    pytester: pytest.Pytester, broken: str, caught_by: str
) -> None:
    """A creation time moved by a save, an ``after`` counted in the last-save order, ties the other way: each fails."""
    result = _session(pytester, broken, DECIDING, LISTING, LISTING_BROKEN[broken], cls="Broken")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"FAILED *::TestStore::{caught_by}*"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broken", "caught_by"),
    [
        ("append_ignores_the_version", "test_append_takes_only_the_next_version_from_the_holder"),
        ("two_owners_hold_the_lease", "test_a_live_lease_refuses_every_other_owner_naming_the_holder"),
        ("decide_loses_a_concurrent_decision", "test_people_deciding_at_once_on_two_calls_both_decisions_are_kept"),
        ("append_drops_entries", "test_load_rebuilds_the_run_object_s_snapshot_after_each_write"),
    ],
)
def test_a_store_that_breaks_one_rule_fails_the_suite(pytester: pytest.Pytester, broken: str, caught_by: str) -> None:
    """Each broken store fails the suite, at least in the check of the rule it breaks."""
    result = _session(pytester, broken, DECIDING, BROKEN[broken], cls="Broken")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.parseoutcomes().get("failed", 0) >= 1
    result.stdout.fnmatch_lines([f"FAILED *::TestStore::{caught_by}*"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broken", "caught_by"),
    [
        ("renew_ignores_the_version", "test_renew_is_checked_like_append_at_the_version_the_owner_names"),
        ("akeep_takes_a_run_back", "test_each_async_twin_refuses_what_its_sync_method_refuses"),
        ("asave_is_no_compare_and_set", "test_each_async_twin_refuses_what_its_sync_method_refuses"),
    ],
)
def test_a_store_that_breaks_a_rule_the_twins_or_renew_keep_fails_the_suite(
    pytester: pytest.Pytester, broken: str, caught_by: str
) -> None:
    """renew is fenced like append; akeep never takes a run back; asave is a compare-and-set, like save."""
    result = _session(pytester, broken, DECIDING, BROKEN[broken], cls="Broken")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"FAILED *::TestStore::{caught_by}*"])
