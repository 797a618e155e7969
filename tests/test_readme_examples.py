"""The README's first example runs offline as a new user would paste it, from a directory of their own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def _python_blocks(section: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{section}\n")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_first_readme_example_runs_offline_and_answers(tmp_path: Path) -> None:
    """The first block of "Using it" needs no key and no network: it prints the answer and the path taken."""
    first = _python_blocks("## Using it")[0]
    done = _run(first, tmp_path)
    assert done.returncode == 0, done.stderr
    answer, path = done.stdout.splitlines()[:2]
    assert answer == "21 degrees and dry: no umbrella needed."
    assert path.endswith("'Dispatch->Done[has_no_tool_calls]']")


def test_the_transition_by_transition_example_runs_on_the_first_example_s_agent(tmp_path: Path) -> None:
    """ "Transition by transition" continues the first example: each advance prints an edge, then the reason."""
    first = _python_blocks("## Using it")[0]
    stepwise = _python_blocks("### Transition by transition")[0]
    done = _run(first + "\n" + stepwise, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2] == "AwaitModel -> CheckTruncation "
    assert lines[-1] == "done"


def test_the_conversations_example_runs_offline_and_prints_what_its_comments_say(tmp_path: Path) -> None:
    """ "Conversations": the second run continues the first; the system prompt leads once; its own part is shown."""
    block = _python_blocks("### Conversations")[0]
    done = _run(block, tmp_path)
    assert done.returncode == 0, done.stderr
    final, roles, own = done.stdout.splitlines()
    assert final == "Doubled: 10"
    assert roles == "['system', 'user', 'assistant', 'tool', 'assistant', 'user', 'assistant']"
    assert own == "['Double it.', 'Doubled: 10']"


def test_the_typed_answers_example_runs_offline_and_prints_what_its_comments_say(tmp_path: Path) -> None:
    """ "Typed answers": two answers go back (a missing field, then the validator's Retry); the third is the output."""
    block = _python_blocks("### Typed answers")[0]
    done = _run(block, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["Forecast(city='Oslo', celsius=21)", "2", "- celsius: Field required"]


def test_the_sub_agents_example_runs_offline_and_prints_what_its_comments_say(tmp_path: Path) -> None:
    """ "Sub-agents": the child's 80 tokens and the parent's 20 spend the budget; the step names the child run."""
    block = _python_blocks("### Sub-agents")[0]
    done = _run(block, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["token_budget 100", "trip/c1", '"Paris"']


def test_the_long_runs_example_runs_offline_and_prints_what_its_comments_say(tmp_path: Path) -> None:
    """ "Long runs": the overflow is compacted, the model gets the short history, the run keeps every message."""
    block = _python_blocks("### Long runs: context overflow, compaction, history processors")[0]
    done = _run(block, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "AwaitModel->AwaitModel[compacts_history]",
        "['Earlier: 4 messages about a long log. Go on.']",
        "5 ['tool_call', 'compaction', 'final']",
    ]


def test_the_guardrails_example_runs_offline_and_its_assertions_hold(tmp_path: Path) -> None:
    """ "Guardrails": a tripped input makes no model call; a tripped answer is kept; its asserts pass as pasted."""
    block = _python_blocks("### Guardrails")[0]
    done = _run(block, tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_session_example_runs_offline_and_reads_the_conversation_back(tmp_path: Path) -> None:
    """ "Conversations": two turns of a stored Session, then a new Session object counts them from the store."""
    block = _python_blocks("### Conversations")[1]
    done = _run(block, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["Hello, Ada.", "Your name is Ada.", "2"]
