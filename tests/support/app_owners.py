"""Second owners from apps: requests sent at the same moment to a served AG-UI app or run viewer, counted.

``at_once`` runs a few callables in threads released together by one
barrier and returns what each gave (or raised), in order, so a test can
race an AG-UI request against another, against a viewer's decision or
against a resume in this process, then count what ran.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from support.agui_apps import parse_sse

JOIN = 60
"""Seconds a racing thread may take (a busy two-core machine with PostgreSQL beside): a hung one fails the test."""


def at_once(*work: Callable[[], Any]) -> list[Any]:
    """Call each of ``work`` in its own thread, all released by one barrier; each one's return value or exception."""
    start = threading.Barrier(len(work))
    results: list[Any] = [None] * len(work)

    def one(index: int, call: Callable[[], Any]) -> None:
        start.wait()
        try:
            results[index] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which says what it expected
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i, call), daemon=True) for i, call in enumerate(work)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN)
        assert not thread.is_alive(), "a racing request never ended"
    return results


def staggered(
    first: Callable[[], Any], second: Callable[[], Any], trial: int, trials: int, step: float = 0.01
) -> list[Any]:
    """``at_once(first, second)``, one side held back: ``second`` in the first half of the trials, else ``first``.

    The hold grows away from the middle trial (``step`` seconds a trial), so over the
    trials each side gets ahead by more and more, whichever is faster on
    this machine, and both orders are met.
    """
    hold = (trial - trials // 2) * step

    def late(call: Callable[[], Any], seconds: float) -> Callable[[], Any]:
        def held() -> Any:
            time.sleep(seconds)
            return call()

        return held

    if hold < 0:
        return at_once(first, late(second, -hold))
    return at_once(late(first, hold), second)


def stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST ``body`` to an AG-UI app at ``url`` and read its whole event stream."""
    with httpx.Client(timeout=JOIN) as http, http.stream("POST", url, json=body) as response:
        assert response.status_code == 200, response.read()
        return parse_sse(list(response.iter_lines()))


def decide(url: str, run_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST a decision to a run viewer at ``url`` as its page does: the status and the JSON answer."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}/api/decide?id={urllib.request.quote(run_id, safe='')}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=JOIN) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ending(events: Sequence[dict[str, Any]]) -> str:
    """How a stream ended: ``RUN_ERROR``, or ``RUN_FINISHED`` with its outcome's type (``RUN_FINISHED success``)."""
    last = events[-1]
    if last["type"] == "RUN_FINISHED":
        return f"RUN_FINISHED {last['outcome']['type']}"
    return str(last["type"])


def results_of(events: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """The tool results a stream carried: (call id, content) each."""
    return [(e["toolCallId"], e["content"]) for e in events if e["type"] == "TOOL_CALL_RESULT"]
