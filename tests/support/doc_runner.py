"""Runs one page's steps in a fresh interpreter whose working directory is outside the clone.

Read by ``test_docs_examples`` and passed to ``python -c``, so ``sys.path[0]``
is that directory and nothing of the clone but the installed package is
importable. It reads the steps as JSON on stdin and writes one result per
step (printed text, or the error) as JSON to the file named in ``argv[1]``;
it stops at the first step that fails.
"""

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import traceback
from pathlib import Path


def _extras(root: Path) -> set[str]:
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return set(project["project"]["optional-dependencies"])


def _targets(root: Path) -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (root / "Makefile").read_text(encoding="utf-8"), re.M))


def _command(text: str, root: Path) -> tuple[str, str | None]:
    """(printed text, error) of one console command."""
    words = shlex.split(text)
    if words[:2] == ["pip", "install"]:
        # What installs while the package is not on PyPI: the clone (`.`), or the wheel `make dist` built.
        given = words[2:]
        if given[:2] == ["--find-links", "dist"]:
            given, forms = given[2:], r"fsm-agent(?:\[([a-z0-9,-]+)\])?"
        else:
            forms = r"\.(?:\[([a-z0-9,-]+)\])?"
        unknown = []
        for word in given or [""]:
            found = re.fullmatch(forms, word)
            if found is None:
                wanted = "pip install '.[EXTRAS]' (in the clone) or pip install --find-links dist 'fsm-agent[EXTRAS]'"
                return "", f"the docs install with {wanted}, not {text!r}"
            unknown += sorted(set((found[1] or "").split(",")) - _extras(root) - {""})
        return "", f"no such extra in pyproject.toml: {unknown}" if unknown else None
    if words[0] == "make":
        missing = sorted(set(words[1:]) - _targets(root))
        return "", f"no such make target: {missing}" if missing else None
    if words[0] == "fsm-agent":
        # The command pip installs next to the interpreter (on PATH in an active virtual environment).
        script = Path(sys.executable).parent / "fsm-agent"
        if not script.is_file():
            return "", f"no fsm-agent command next to {sys.executable}: reinstall the package (make install)"
        words = [str(script), *words[1:]]
    elif words[0] == "python":
        words[0] = sys.executable
    else:
        return "", f"console blocks run `fsm-agent ...`, `python ...`, `pip install` and `make` only, not {words[0]!r}"
    done = subprocess.run(words, capture_output=True, text=True, timeout=240, check=False)
    if done.returncode != 0:
        return done.stdout, f"exit {done.returncode}\n{done.stderr}"
    return done.stdout, None


def main() -> None:
    job = json.loads(sys.stdin.read())
    root = Path(job["root"])
    namespace: dict[str, object] = {"__name__": "__main__"}
    results: list[dict[str, object]] = []
    for step in job["steps"]:
        printed, error = "", None
        if step["kind"] == "file":
            target = Path(step["name"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step["text"], encoding="utf-8")
        elif step["kind"] == "python":
            buffer = io.StringIO()
            try:
                code = compile(step["text"], f"{job['page']}:{step['line']}", "exec")
                with contextlib.redirect_stdout(buffer):
                    exec(code, namespace)  # running the page's own snippet is the point
            except BaseException:  # noqa: BLE001 - SystemExit and KeyboardInterrupt in a snippet are failures too
                error = traceback.format_exc()
            printed = buffer.getvalue()
        else:
            printed, error = _command(step["text"], root)
        results.append({"printed": printed, "error": error})
        Path(sys.argv[1]).write_text(json.dumps(results), encoding="utf-8")
        if error is not None:
            break
    sys.stdout.flush()
    os._exit(0)  # a snippet's non-daemon threads (a server left running) must not hold the page open


main()
