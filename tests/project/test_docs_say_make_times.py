"""`make test`'s time is the same in the README, the development page and `make help`, each saying on 2 cores."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _minutes(text: str, pattern: str) -> int:
    found = re.search(pattern, text, re.S | re.M)  # re.M: the Makefile pattern anchors `^` at its line
    assert found, pattern
    return int(found[1])


def test_make_test_takes_the_same_time_everywhere_it_is_stated() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    development = (ROOT / "docs" / "contributing" / "development.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    stated = {
        _minutes(readme, r"`make test` makes the same set-up.*?about (\d+) minutes"),
        _minutes(development, r"\| `make test` \|[^|]*?about (\d+) minutes"),
        _minutes(makefile, r"^test: .*?## .*?about (\d+) minutes"),
    }
    assert len(stated) == 1, stated


def test_every_place_says_on_2_cores() -> None:
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    development = (ROOT / "docs" / "contributing" / "development.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    minutes = _minutes(readme, r"runs the whole suite: about (\d+) minutes")
    assert f"runs the whole suite: about {minutes} minutes on 2 cores" in readme
    assert f"about {minutes} minutes on 2 cores (" in development
    assert f"(about {minutes} minutes on 2 cores:" in makefile
