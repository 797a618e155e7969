"""What the checker proves of an agent with the default settings, as the README and the docs state it.

``make diagram`` writes this block beside the drawing, so the bound the
README states is the one ``check`` proves, of the table as it stands, for a
default ``Agent(model, tools)``: ``Limits()`` and no optional part.  (A bare
table is checked with every optional part present, so ``check
fsm_agent:TABLE`` reports more stops reachable than this block does.)
"""

from __future__ import annotations

from fsm_agent.definition.limits import Limits
from fsm_agent.definition.table import Table
from fsm_agent.proof.check import Proof, prove
from fsm_agent.proof.model import Setup

REPLY_SIZES = (1, 2, 4)
"""The tool calls per reply the block states a bound in transitions for."""


def default_proofs(table: Table) -> tuple[Proof, dict[int, Proof]]:
    """The proof for an agent with the default settings, and one per reply size of ``REPLY_SIZES``."""
    plain = prove(Setup(table, Limits()))
    return plain, {n: prove(Setup(table, Limits(), calls_per_reply=n)) for n in REPLY_SIZES}


def proof_block(table: Table) -> str:
    """The Markdown the ``proof`` block of the README and the docs holds."""
    plain, sized = default_proofs(table)
    if not plain.ok:
        return "**Not every run stops**: `python -m fsm_agent check` prints the loop that never ends."
    limits = Limits()
    rows = "\n".join(f"| {n} | {proof.bound} |" for n, proof in sized.items())
    return (
        f"What the checker proves of a default `Agent(model, tools)`: the default limits "
        f"(`max_steps={limits.max_steps}`; no `timeout`, budget or `max_tool_calls`) and no hooks, typed answer or "
        f"sub-agent. **Every run stops**, after at most **{plain.model_calls} model calls**, whatever the model says. "
        f"In transitions, the bound grows with the tool calls a reply asks for; "
        f"`python -m fsm_agent check yourmodule:make_agent --calls-per-reply N`, with `make_agent` a function of "
        f"yours that returns such an agent, prints each row:\n\n"
        f"| tool calls per reply | at most transitions |\n| ---: | ---: |\n{rows}\n\n"
        f"Reachable stops: {', '.join(f'`{r}`' for r in plain.reachable)}. "
        f"Not reachable without the part or limit that makes them: "
        f"{', '.join(f'`{r}`' for r in plain.unreachable)}."
    )
