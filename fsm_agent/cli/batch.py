"""The ``batch`` command: run every question of a JSON Lines file, on Ray or in this process, with a progress bar.

``python -m fsm_agent batch questions.jsonl --model openai:gpt-4o-mini
--store runs.db`` runs each line (a JSON string, or an object with
``input`` and optionally ``run_id``) as one run of the same agent, shows
runs done, failed by reason and in flight with the rate and time left, writes
each result to ``--out`` as a JSON line the moment it ends, and closes with a
table of reasons.  On Ray it first says which Ray it uses: one it started
(the default), or the cluster ``--ray`` asked it to join.  Exit 0 only if
every run ended ``done``, 2 if any stopped, 1 for a set-up error, 130 on
Ctrl-C: the runs in flight keep their last checkpoint, and the same command
run again resumes the batch.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fsm_agent.batch import BatchItem, batch_items, iter_batch
from fsm_agent.batch.progress import Bar, Tally
from fsm_agent.cli import (
    EXIT_DONE,
    EXIT_INTERRUPTED,
    EXIT_SETUP,
    EXIT_STOPPED,
    SetupError,
    described,
    import_named,
    model_flags,
    out_file,
)
from fsm_agent.cli import run as run_command
from fsm_agent.core.pricing import Price, UnpricedModelError
from fsm_agent.drivers.agent import Agent
from fsm_agent.jsontext import dumps
from fsm_agent.records import RunResult


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent batch``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "batch", help="run every question of a JSON Lines file, resumably", description=described(__doc__)
    )
    parser.add_argument("inputs", type=Path, help='JSON Lines: one "question" or {"input": ..., "run_id": ...} a line')
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--model", metavar="PROVIDER:NAME", help="e.g. openai:gpt-4o-mini, with the built-in tools")
    who.add_argument(
        "--agent", metavar="MODULE:FUNCTION", help="your own agent: a function with no arguments returning an Agent"
    )
    parser.add_argument("--base-url", metavar="URL", help="the API endpoint of an OpenAI-compatible server")
    parser.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    parser.add_argument("--max-retries", type=int, default=2, help="retries of 429/5xx errors by the SDK (default 2)")
    parser.add_argument(
        "--price", type=model_flags.price_flag, metavar="INPUT,OUTPUT[,CACHED]", help=model_flags.PRICE_HELP
    )
    parser.add_argument("--system", default=run_command.DEFAULT_SYSTEM, help="the system prompt (with --model)")
    parser.add_argument("--max-steps", type=int, default=8, help="model turns before a run stops (default 8)")
    parser.add_argument(
        "--max-consecutive-failures", type=int, default=3, help="failed tool calls in a row (default 3)"
    )
    for flag, keyword, kind, text in run_command.LIMIT_FLAGS:
        parser.add_argument(flag, dest=keyword, type=kind, default=None, help=text)
    parser.add_argument("--store", required=True, metavar="FILE|URL", help="where runs are checkpointed (required)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="join a running Ray cluster: auto (RAY_ADDRESS, else the last `ray start`), HOST:PORT or "
        "ray://HOST:PORT (default: start a Ray instance of its own, whatever cluster is running)",
    )
    where.add_argument("--local", action="store_true", help="no Ray: every run in this process (the async driver)")
    parser.add_argument("--max-in-flight", type=int, metavar="N", help="runs at once (default: CPUs x 4; local 64)")
    parser.add_argument("--task-retries", type=int, default=3, help="Ray retries of a task whose worker died (3)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write each result as a JSON line as it ends")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=main)


def read_inputs(path: Path) -> list[BatchItem]:
    """The batch's items from a JSON Lines file; ``SetupError`` naming the first bad line."""
    entries: list[Any] = []
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    entries.append(json.loads(line))
                except ValueError as exc:
                    msg = f"{path}:{number}: not JSON ({exc})"
                    raise SetupError(msg) from None
    except OSError as exc:
        msg = f"cannot read {path}: {exc}"
        raise SetupError(msg) from None
    try:
        return batch_items(entries)
    except (TypeError, ValueError) as exc:
        msg = f"{path}: {exc} (input numbers count non-blank lines from 0)"
        raise SetupError(msg) from None


def model_agent(
    spec: str,
    base_url: str | None,
    api_key_env: str | None,
    max_retries: int,
    system: str,
    limits: dict[str, Any],
    price: Price | None,
) -> Agent:
    """The ``--model`` agent, built in the worker: the provider's adapter, the built-in tools and ``--price``."""
    from fsm_agent.tools.builtin import builtin_registry  # a worker loads it when it runs

    model = model_flags.build_model(spec, base_url, api_key_env, max_retries)
    try:
        return Agent(model, builtin_registry(), system, prices=price, **limits)
    except UnpricedModelError as exc:  # its own words say prices=, which a command-line user cannot pass
        raise SetupError(exc.explain(model_flags.PRICE_FLAG)) from None


def _factory(args: argparse.Namespace, on_ray: bool) -> Callable[[], Agent]:
    limits = {"max_steps": args.max_steps, "max_consecutive_failures": args.max_consecutive_failures}
    limits |= {k: getattr(args, k) for _, k, _, _ in run_command.LIMIT_FLAGS if getattr(args, k) is not None}
    if args.model is not None:
        settings = (args.model, args.base_url, args.api_key_env, args.max_retries, args.system, limits, args.price)
        make: Callable[[], Agent] = functools.partial(model_agent, *settings)
    else:
        run_command.refuse_model_flags(args)
        make = imported(args.agent, on_ray)
    # Built once here so a missing key, SDK or module is one line now, not one error per run.
    close = getattr(built(make).model, "close", None)
    if callable(close):
        close()
    return make


def built(make: Callable[[], Agent]) -> Agent:
    """The agent ``make()`` returns; ``SetupError`` in one line if it raises or returns something else."""
    try:
        agent = make()
    except SetupError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's factory failing is a set-up error, in one line
        msg = f"cannot build the agent: {type(exc).__name__}: {exc}"
        raise SetupError(msg) from None
    if inspect.iscoroutine(agent):  # an async factory import_named could not tell (an object's async __call__)
        agent.close()  # never awaited: closed, so Python does not warn of it
        msg = "the agent factory is async: make it a plain def that returns the agent (the command line calls it)"
        raise SetupError(msg)
    if not isinstance(agent, Agent):
        msg = f"the agent factory must return an Agent, got {type(agent).__name__}"
        raise SetupError(msg)
    return agent


def imported(target: str, on_ray: bool = False) -> Callable[[], Agent]:
    """The user's agent factory named ``MODULE:FUNCTION`` (``--agent``), imported; ``SetupError`` if it cannot be."""
    make = import_named(target, "--agent")
    if on_ray:
        # Ray workers may not see the module's directory: ship its code with the function.
        try:
            cloudpickle: Any = importlib.import_module("ray.cloudpickle")  # only a batch on Ray needs it
        except ImportError:
            msg = (
                "a batch on Ray needs Ray: install the package's ray extra (in a clone: pip install '.[ray]'), "
                "or run it here with --local"
            )
            raise SetupError(msg) from None
        cloudpickle.register_pickle_by_value(sys.modules[target.partition(":")[0]])
    return make  # type: ignore[no-any-return]  # the user's function, checked by calling it once


def result_line(item: BatchItem, result: RunResult) -> str:
    """One ``--out`` line: which run, how it ended, and the whole result (without its snapshot, kept in the store)."""
    data = result.to_dict()
    data.pop("snapshot", None)
    head = {"index": item.index, "run_id": item.run_id, "ok": result.ok, "reason": result.reason}
    # Half an emoji (which providers send) is written as its escape: the line stays UTF-8 and reads back exact.
    return dumps({**head, "final": result.final, "result": data}) + "\n"


def _check_counts(args: argparse.Namespace) -> None:
    """Refuse ``--max-in-flight`` or ``--task-retries`` out of range: a ``SetupError`` naming the flag.

    ``iter_batch`` checks them too, but only once the store is created and
    ``--out`` truncated, and by its keywords' names (its ``max_retries``
    would read as ``--max-retries``, the SDK's retries).
    """
    if args.max_in_flight is not None and args.max_in_flight < 1:
        msg = f"--max-in-flight must be >= 1, got {args.max_in_flight}"
        raise SetupError(msg)
    if args.task_retries < 0:
        msg = f"--task-retries must be >= 0, got {args.task_retries}"
        raise SetupError(msg)


def _check_store(spec: str) -> None:
    # Opened as every command opens --store, so a store that will not open is the same one line everywhere.
    run_command.open_store(spec).close()


def main(args: argparse.Namespace) -> int:
    """Run the batch; the exit code says how it ended (0 all done, 1 set-up, 2 some stopped, 130 Ctrl-C)."""
    err = sys.stderr
    try:
        _check_counts(args)  # before anything is read, built, created or truncated
        items = read_inputs(args.inputs)
        make_agent = _factory(args, on_ray=not args.local)  # before the store: a refused agent leaves no file
        if args.out is not None:  # its folder made and checked before the store: a refused --out leaves no file
            out_file(args.out, "--out")
        _check_store(args.store)
        out = None if args.out is None else _open_out(args.out)
    except SetupError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_SETUP
    tally = Tally(len(items))
    bar = None
    ray_started = False
    try:
        if items and not args.local:
            ray_started = _join_ray(args.ray, err)
        bar = None if args.quiet else Bar(tally, err)
        results = iter_batch(
            make_agent,
            [{"input": item.input, "run_id": item.run_id} for item in items],
            store=args.store,
            executor="local" if args.local else "ray",
            ray_address=args.ray,
            max_retries=args.task_retries,
            max_in_flight=args.max_in_flight,
            on_start=tally.start,
            on_end=tally.end,
            on_status=_status(bar, err),
        )
        with contextlib.closing(results):
            for item, result in results:
                if out is not None:
                    out.write(result_line(item, result))
                    out.flush()
                if bar is None:
                    tally.finish(result)
                else:
                    bar.update(result)
    except KeyboardInterrupt:
        _close(bar, out)
        print(f"\ninterrupted: {tally.finished} of {tally.total} runs ended; the rest are checkpointed in", file=err)
        print(f"{args.store}: run the same command again to resume them", file=err)
        return EXIT_INTERRUPTED
    except (SetupError, ValueError, TypeError, ImportError) as exc:  # no Ray; the executor refused its set-up
        _close(bar, out)
        print(f"error: {exc}", file=err)
        return EXIT_SETUP
    finally:
        if ray_started:
            _leave_ray()
    _close(bar, out)
    print(tally.table(), file=err)
    return EXIT_DONE if tally.all_done else EXIT_STOPPED


def _join_ray(address: str | None, err: IO[str]) -> bool:
    """Start Ray (no ``--ray``) or join the cluster ``--ray`` names, and say which; True if the batch connected it.

    Connected here rather than inside ``iter_batch`` so the line can say
    which Ray it is before the first run, whichever one ``ray.init`` found.
    """
    from fsm_agent.batch import ray_cluster  # Ray is imported only by a batch on Ray

    if not ray_cluster.connected():
        print(ray_cluster.connecting(address), file=err, flush=True)  # before the seconds Ray takes to start or join
    try:
        started = ray_cluster.connect(address)
        said = ray_cluster.describe(address, started)
    except (ImportError, ValueError, ConnectionError, RuntimeError) as exc:  # no Ray, a bad address, nobody there
        msg = f"--ray {address}: {exc}" if address is not None else f"cannot start Ray: {exc}"
        raise SetupError(msg.strip().splitlines()[0]) from None
    print(f"ray: {said}", file=err, flush=True)
    return started


def _status(bar: Bar | None, err: IO[str]) -> Callable[[str], None]:
    """Where the batch's set-up lines go (the workers it starts): above the bar, else on ``err``."""
    if bar is not None:
        return bar.say
    return lambda text: print(text, file=err, flush=True)


def _leave_ray() -> None:
    from fsm_agent.batch import ray_cluster

    ray_cluster.disconnect()


def _open_out(path: Path) -> IO[str]:
    try:
        return path.open("w", encoding="utf-8")
    except OSError as exc:
        msg = f"cannot write --out {path}: {exc}"
        raise SetupError(msg) from None


def _close(bar: Bar | None, out: IO[str] | None) -> None:
    if bar is not None:
        bar.close()
    if out is not None:
        out.close()
