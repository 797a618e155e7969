"""An agent whose tools come from an MCP server (examples/mcp_server.py), offline: a scripted model asks for them.

Swap ``FakeModel`` for ``OpenAIChatModel("gpt-4o-mini")`` (or any model) to let a real model choose.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fsm_agent import Agent
from fsm_agent.mcp import stdio_tools
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

server = Path(__file__).with_name("mcp_server.py")
model = FakeModel(tool_turn(tool_call("word_count", text="to be or not to be")), reply("It has 6 words."))

with stdio_tools(sys.executable, [str(server)]) as tools:
    print("tools:", ", ".join(tools))
    result = Agent(model, tools).run("How many words are in 'to be or not to be'?")

print("tool said:", result.messages[-2].content)
print("answer:", result.final)
