"""How long a provider asks a client to wait before it retries (``Retry-After``), for an SDK that does not ask.

The OpenAI and Anthropic SDKs honour the header themselves: a wait of up to
two minutes is waited, and a longer one is not retried at all (the error
goes out, and the run stops ``model_error``, to be resumed later).  The
Gemini SDK ignores the header; its adapter follows the same rule with these.
"""

from __future__ import annotations

import email.utils
import math
import time
from typing import Any

MAX_RETRY_AFTER = 120.0
"""The longest wait, in seconds, a retry honours; a server asking for more is not retried (as the other SDKs do)."""


def server_delay(headers: Any) -> float | None:
    """Seconds ``headers`` ask a client to wait: ``retry-after-ms``, else ``Retry-After`` as seconds or an HTTP date.

    ``None`` when they ask nothing readable.  A date is read against this
    machine's clock, so it may come out zero or negative.
    """
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            seconds = float(headers.get(name)) / scale
        except (TypeError, ValueError):
            continue
        return seconds if math.isfinite(seconds) else None
    date = email.utils.parsedate_tz(headers.get("retry-after") or "")
    return None if date is None else email.utils.mktime_tz(date) - time.time()
