"""``StoreConformance``: the tests any checkpoint store runs to prove it keeps the store contract.

A store of yours (``fsm_agent.persist.store.JournaledStore``) subclasses it in
a test module and says how to open one; pytest then runs every check on it,
as the package runs them on ``SqliteStore`` and ``PostgresStore``::

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def make_store(self):
            return lambda lease: MyStore(lease=lease)

The checks are of the contract as data: which write a store takes and which
it refuses, with what error and what left stored; never how fast.  What
``FullStore`` adds to a ``JournaledStore`` (``keep``, ``decide``,
``list_runs`` with its paging by cursor and its ``parent`` filter, ``delete`` and
``delete_finished``, the async twins) is checked where
the store has it and skipped, naming the method, where it has not.  Two
optional fixtures open more checks: ``reopen_store`` (owners racing from
store objects of their own, as processes do) and ``lose_entry`` (a journal
that lost an entry).  Importing this module imports pytest; ``import
fsm_agent`` never does.
"""

from __future__ import annotations

import pytest

from fsm_agent.testing.store_children import ChildrenChecks
from fsm_agent.testing.store_kit import BAD_SNAPSHOTS as BAD_SNAPSHOTS
from fsm_agent.testing.store_kit import LAPSE as LAPSE
from fsm_agent.testing.store_kit import LONG as LONG
from fsm_agent.testing.store_kit import RACERS as RACERS
from fsm_agent.testing.store_kit import SHORT as SHORT
from fsm_agent.testing.store_kit import LoseEntry as LoseEntry
from fsm_agent.testing.store_kit import MakeStore as MakeStore
from fsm_agent.testing.store_kit import ReopenStore as ReopenStore
from fsm_agent.testing.store_kit import Script as Script
from fsm_agent.testing.store_listing import ListingChecks
from fsm_agent.testing.store_owners import OwnerChecks
from fsm_agent.testing.store_twins import TwinChecks
from fsm_agent.testing.store_writes import WriteChecks


# pytest collects the checks of the bases last listed first: owners, writes, twins, paging, then children.
class StoreConformance(ChildrenChecks, ListingChecks, TwinChecks, WriteChecks, OwnerChecks):
    """The store contract, one test each: subclass it in a test module and override ``make_store``.

    ``make_store`` is a fixture giving a function ``make_store(lease)`` that
    opens a store on a fresh, empty location (a new file, database or
    namespace per test), leasing runs for ``lease`` seconds; each test calls
    it once.  Override the ``reopen_store`` fixture too to check owners
    racing for a run from store objects of their own, and ``lose_entry`` to
    check that a store refuses to rebuild a run whose journal lost an entry.
    """

    @pytest.fixture
    def make_store(self) -> MakeStore:
        """Override: ``make_store(lease)``, a store on a fresh, empty location for this test."""
        msg = "override the make_store fixture: a function of the lease giving a store on a fresh, empty location"
        raise NotImplementedError(msg)

    @pytest.fixture
    def reopen_store(self) -> ReopenStore | None:
        """Override: ``reopen_store(lease)``, another store object on ``make_store``'s location; None: skip."""
        return None

    @pytest.fixture
    def lose_entry(self) -> LoseEntry | None:
        """Override to delete one journal entry behind the store's back (``lose_entry(run_id, seq)``); None: skip."""
        return None
