"""What a model call costs: an agent's own prices, else the ``genai-prices`` package's, else unknown.

An agent prices each reply's usage once, when the reply is recorded
(``core.ledger``), with the ``Pricing`` its settings hold.  The prices come
from ``Agent(prices=...)`` (a ``Price``, or a mapping of model names to
prices) for unlisted, self-hosted or test models; otherwise from
``genai-prices`` (the ``prices`` extra), found by the model's name and the
URL it sends requests to (an adapter's ``model`` and ``base_url``), so an
OpenAI-compatible server the package does not know stays unpriced rather
than being billed at OpenAI's rates.  Unknown is ``None``, never a guess;
a ``cost_budget`` over an unknown price is refused when the agent is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fsm_agent.definition.limits import as_dollars
from fsm_agent.errors import FsmAgentError
from fsm_agent.records import Usage

PER_MTOK = 1_000_000


def _usd(value: Any) -> float:
    amount = as_dollars(value)
    if amount is None:
        msg = f"a price must be a finite number of US dollars >= 0, got {value!r}"
        raise ValueError(msg)
    return amount


def _optional_usd(value: Any) -> float | None:
    return None if value is None else _usd(value)


@attrs.frozen
class Price:
    """A model's price in US dollars per million tokens (``Decimal`` or ``float``; kept as ``float``).

    Cached input tokens (``Usage.cache_read_tokens``) are priced at
    ``cached_input_per_mtok`` (``None``: at the input price); every other
    input token, a cache write included, at ``input_per_mtok``; every output
    token, reasoning included, at ``output_per_mtok``.
    """

    input_per_mtok: float = attrs.field(converter=_usd)
    output_per_mtok: float = attrs.field(converter=_usd)
    cached_input_per_mtok: float | None = attrs.field(default=None, converter=_optional_usd)

    def cost(self, usage: Usage) -> float:
        """The US dollars ``usage`` costs at this price."""
        cached = min(usage.cache_read_tokens, usage.input_tokens)
        cached_rate = self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok
        dollars = (
            (usage.input_tokens - cached) * self.input_per_mtok
            + cached * cached_rate
            + usage.output_tokens * self.output_per_mtok
        )
        return dollars / PER_MTOK


def model_name(model: object) -> str | None:
    """The name a model is priced by: its ``model`` attribute (what the bundled adapters send), if a string."""
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


class Pricing:
    """How an agent prices its model's calls: a ``Price``, the ``genai-prices`` lookup, or nothing (unknown).

    Called with a call's ``Usage``, it returns the US dollars (``None`` where
    the price is unknown).  ``source`` says where the price comes from, for
    messages: ``"prices="``, ``"genai-prices"`` or ``None``.
    """

    def __init__(self, model: str | None, price: Price | None = None, url: str | None = None) -> None:
        self.model = model
        self.price = price
        self.url = url
        # Whether genai-prices lists the model at url: asked when first needed (the package loads its data once
        # per process, 0.6 s, and answers in 82 us after), so an agent built per request pays nothing for it.
        self._listed: bool | None = None

    @property
    def source(self) -> str | None:
        """Where the price comes from: ``"prices="``, ``"genai-prices"``, or None (unknown)."""
        if self.price is not None:
            return "prices="
        if self.url is None or self.model is None:
            return None
        if self._listed is None:
            self._listed = _listed(self.model, self.url)
        return "genai-prices" if self._listed else None

    @property
    def known(self) -> bool:
        """Whether a call of this model can be priced."""
        return self.source is not None

    def __call__(self, usage: Usage) -> float | None:
        if self.price is not None:
            return self.price.cost(usage)
        if self.url is None or self.model is None or not self.known:
            return None
        return _genai_cost(usage, self.model, self.url)

    def __repr__(self) -> str:
        return f"Pricing({self.model!r}, source={self.source!r})"


NO_PRICING = Pricing(None)
"""The pricing of a model nothing prices: every call's cost is unknown."""


def _genai_usage(usage: Usage) -> Any:
    import genai_prices  # the prices extra, loaded by the first call it prices

    return genai_prices.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )


def _genai_cost(usage: Usage, model: str, url: str) -> float | None:
    import genai_prices

    try:
        calculation = genai_prices.calc_price(_genai_usage(usage), model, provider_api_url=url)
    except LookupError:
        return None
    return float(calculation.total_price)


def _listed(model: str, url: str) -> bool:
    """Whether ``genai-prices`` (if installed) knows the provider at ``url`` and the model ``model`` there."""
    try:
        import genai_prices  # noqa: F401 - only whether the extra is installed
    except ImportError:
        return False
    return _genai_cost(Usage(), model, url) is not None


def pricing_of(model: object, prices: Price | Mapping[str, Price] | None) -> Pricing:
    """The pricing of ``model``'s calls: ``prices`` (a ``Price``, or the entry for its name), else ``genai-prices``."""
    name = model_name(model)
    if isinstance(prices, Price):
        return Pricing(name, prices)
    if prices is not None:
        if not isinstance(prices, Mapping):
            msg = f"prices must be a Price or a mapping of model names to Price, got {type(prices).__name__}"
            raise TypeError(msg)
        for key, value in prices.items():
            if not isinstance(key, str) or not isinstance(value, Price):
                msg = f"prices must map model names (str) to Price, got {key!r}: {type(value).__name__}"
                raise TypeError(msg)
        if name is not None and name in prices:
            return Pricing(name, prices[name])
    url = getattr(model, "base_url", None)
    return Pricing(name, url=url if isinstance(url, str) else None)


PRICES_KEYWORD = "pass prices=Price(input_per_mtok=..., output_per_mtok=...) (or a mapping of model names to Price)"
"""How ``UnpricedModelError`` tells a caller of ``Agent`` to give a price."""


class UnpricedModelError(FsmAgentError, ValueError):
    """A ``cost_budget`` over a model with no known price: refused before any call is made.

    A ``ValueError``, as every bad argument is (``Agent(...)`` raises it); a class of its own so that a
    caller who gives prices another way (the command line's ``--price``) can
    say how, with ``explain``, instead of matching the text.
    """

    def __init__(
        self, model: object, pricing: Pricing, sub_agent: str | None = None, through: tuple[str, ...] = ()
    ) -> None:
        self.model = model
        self.pricing = pricing
        self.sub_agent = sub_agent
        """The name of the sub-agent tool whose model it is, or None for the agent's own."""
        self.through = through
        """The sub-agent tools above ``sub_agent``, from the agent's own down: () for its direct sub-agent."""
        super().__init__(self.explain(PRICES_KEYWORD))

    def explain(self, remedy: str) -> str:
        """The refusal, naming the model, with ``remedy`` as the way to give it a price."""
        name = self.pricing.model
        shown = repr(name) if name is not None else f"of type {type(self.model).__name__} (it has no name)"
        text = (
            f"cost_budget needs a price for every model call, and model {shown} has none: {remedy}, "
            "or install genai-prices (pip install 'fsm-agent[prices]') for a model it lists"
        )
        if self.sub_agent is None:
            return text
        return f"sub-agent {' -> '.join(repr(name) for name in (*self.through, self.sub_agent))}: {text}"
