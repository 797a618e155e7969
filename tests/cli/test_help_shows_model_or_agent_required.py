"""``--help`` of the commands that take ``--model`` or ``--agent`` draws them as one required choice.

argparse draws a group as ``(--model ... | --agent ...)`` only when its flags
were added one after the other; before, ``--base-url`` and the rest came
between, and the usage showed two optional flags.
"""

from __future__ import annotations

import pytest

from fsm_agent.cli.main import main


@pytest.mark.parametrize("command", [["run"], ["runs", "resume"], ["runs", "fork"], ["batch"]], ids=" ".join)
def test_help_says_one_of_model_or_agent_is_required(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The usage reads '(--model PROVIDER:NAME | --agent MODULE:FUNCTION)', as the reference page does."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "(--model PROVIDER:NAME | --agent MODULE:FUNCTION)" in shown
