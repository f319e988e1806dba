"""Mutation testing of the pure core against its unit tests.

    nice -n 10 python scripts/mutation.py                  # every module, seeds 0 1 2
    python scripts/mutation.py --modules _limiter --seeds 0
    python scripts/mutation.py --report-only                # MUTATION.md from the last run

Why a mutator of our own: the modules under test are pure (no I/O, no clock), so one
process can import them and their unit tests once and then, for each mutant, ``fork()`` a
child that swaps the ``__code__`` of the one mutated function (every reference to the
function, in the package and in the tests, sees the swap) and runs ``pytest -x`` on the
module's unit tests.  No copy of the source tree, no per-mutant interpreter start-up: a
mutant costs the time of the tests that kill it.  The standard library and pytest are all
it needs.

Mutation operators, applied one at a time inside function bodies (docstrings, ``assert``
statements, ``raise`` statements and exception messages are left alone):

* comparisons: ``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``is``/``is not``, ``in``/``not in``
* arithmetic: ``+``/``-``, ``*``/``/``, ``//``/``/``, augmented ``+=``/``-=``
* boolean: ``and``/``or``; ``not x`` becomes ``x``; an ``if``/``while``/ternary condition
  is negated
* constants: an int ``n`` becomes ``n + 1``, a float ``x`` becomes ``x + 1``,
  ``True``/``False`` swapped
* ``min``/``max`` swapped; ``break``/``continue`` swapped
* statements removed: a call made for its effect, an augmented assignment (a counter
  that is not counted), an assignment to an attribute or subscript (state not recorded)

A mutant *survives* when every selected test passes with it.  A run over several
Hypothesis seeds (``--hypothesis-seed``; the example database is off, so nothing carries
over between runs) shows whether the score depends on the examples drawn.  Each survivor
must be judged in ``tests/mutation-judgements.toml``: ``equivalent`` (no test can tell it
from the original; the reason says why) or a pointer to the test added for it.  The report
(``tests/MUTATION.md``) gives the score per module and seed and every survivor with its
judgement; an unjudged survivor is flagged.

This is not part of the default ``pytest`` run (several minutes on one core); CI does not
run it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import json
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / ".mutation-results.json"
REPORT = ROOT / "tests" / "MUTATION.md"
JUDGEMENTS = ROOT / "tests" / "mutation-judgements.toml"

#: Module -> the unit tests that hold it (most specific first: ``-x`` stops at the first
#: failure, so the likely killer runs first).
TARGETS: dict[str, list[str]] = {
    "_limiter": ["tests/unit/test_limiter.py", "tests/unit/test_limiter_counters.py"],
    "_pool": ["tests/unit/test_pool.py"],
    "_routing": ["tests/unit/test_routing.py", "tests/unit/test_routing_wildcards.py"],
    "_config": ["tests/unit/test_config.py", "tests/unit/test_routing_wildcards.py"],
    "_stats": [
        "tests/unit/test_stats.py",
        "tests/unit/test_stats_format.py",
        "tests/unit/test_stats_assembly.py",
    ],
    "_h2frames": ["tests/unit/test_h2frames_split.py", "tests/unit/test_h2frames.py"],
    "_codec": ["tests/unit/test_codec.py"],
}
DEFAULT_SEEDS = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Mutant:
    module: str
    qualname: str  # of the function whose code is swapped
    line: int
    description: str  # what changed, in source terms
    key: str  # stable name for the judgements file
    index: int  # the site's position in ``_sites`` order


# -- finding mutation sites ------------------------------------------------------------
_COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
}


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """Top-level functions and methods (one class level), with their qualnames."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name != "__repr__":
                    yield f"{node.name}.{item.name}", item


def _skipped(function: ast.FunctionDef) -> set[int]:
    """ids of nodes never mutated: the docstring, asserts, raises (messages)."""
    skip: set[int] = set()
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip.add(id(body[0]))
    for node in ast.walk(function):
        if isinstance(node, ast.Assert | ast.Raise | ast.JoinedStr):
            skip.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.arguments):
            skip.update(id(n) for n in ast.walk(node))  # defaults, annotations
        elif (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node is not function
            and node.returns is not None
        ):
            skip.update(id(n) for n in ast.walk(node.returns))
    if function.returns is not None:
        skip.update(id(n) for n in ast.walk(function.returns))
    for node in ast.walk(function):
        if isinstance(node, ast.AnnAssign):
            skip.update(id(n) for n in ast.walk(node.annotation))
    return skip


def _site_mutations(node: ast.AST) -> list[tuple[str, Callable[[ast.AST], ast.AST | None]]]:
    """The mutations possible at ``node``: (label, apply) where ``apply`` mutates a copy of
    the node in place and returns the node to put in its place (``None``: remove it)."""
    out: list[tuple[str, Callable[[ast.AST], ast.AST | None]]] = []
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            swap = _COMPARE_SWAPS.get(type(op))
            if swap is not None:

                def apply(n: ast.AST, i: int = i, swap: type[ast.cmpop] = swap) -> ast.AST:
                    assert isinstance(n, ast.Compare)
                    n.ops[i] = swap()
                    return n

                out.append((f"{_op(op)} -> {_op(swap())}", apply))
    elif isinstance(node, ast.BinOp):
        bswap = _BINOP_SWAPS.get(type(node.op))
        if bswap is not None and not _is_string(node):

            def apply_bin(n: ast.AST, swap: type[ast.operator] = bswap) -> ast.AST:
                assert isinstance(n, ast.BinOp)
                n.op = swap()
                return n

            out.append((f"{_op(node.op)} -> {_op(bswap())}", apply_bin))
    elif isinstance(node, ast.AugAssign):
        aswap = _BINOP_SWAPS.get(type(node.op)) if isinstance(node.op, ast.Add | ast.Sub) else None
        if aswap is not None:

            def apply_aug(n: ast.AST, swap: type[ast.operator] = aswap) -> ast.AST:
                assert isinstance(n, ast.AugAssign)
                n.op = swap()
                return n

            out.append((f"{_op(node.op)}= -> {_op(aswap())}=", apply_aug))
        out.append(("statement removed", lambda n: None))
    elif isinstance(node, ast.BoolOp):

        def apply_bool(n: ast.AST) -> ast.AST:
            assert isinstance(n, ast.BoolOp)
            n.op = ast.Or() if isinstance(n.op, ast.And) else ast.And()
            return n

        out.append(("and -> or" if isinstance(node.op, ast.And) else "or -> and", apply_bool))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not removed", lambda n: n.operand))  # type: ignore[attr-defined]
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            out.append((f"{value} -> {not value}", lambda n: ast.Constant(not value)))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out.append((f"{value!r} -> {value + 1!r}", lambda n: ast.Constant(value + 1)))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        if name in ("min", "max"):
            other = "max" if name == "min" else "min"

            def apply_call(n: ast.AST, other: str = other) -> ast.AST:
                assert isinstance(n, ast.Call)
                n.func = ast.Name(other, ast.Load())
                return n

            out.append((f"{name} -> {other}", apply_call))
    elif isinstance(node, ast.Break):
        out.append(("break -> continue", lambda n: ast.Continue()))
    elif isinstance(node, ast.Continue):
        out.append(("continue -> break", lambda n: ast.Break()))
    if isinstance(node, ast.If | ast.While | ast.IfExp):

        def apply_neg(n: ast.AST) -> ast.AST:
            assert isinstance(n, ast.If | ast.While | ast.IfExp)
            n.test = ast.UnaryOp(ast.Not(), n.test)
            return n

        out.append(("condition negated", apply_neg))
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call | ast.Await):
        out.append(("statement removed", lambda n: None))
    if isinstance(node, ast.Assign) and all(
        isinstance(t, ast.Attribute | ast.Subscript) for t in node.targets
    ):
        out.append(("statement removed", lambda n: None))
    return out


def _is_string(node: ast.BinOp) -> bool:
    return any(
        isinstance(side, ast.Constant | ast.JoinedStr)
        and isinstance(getattr(side, "value", ""), str)
        for side in (node.left, node.right)
    )


def _op(op: ast.AST) -> str:
    return {
        ast.Lt: "<",
        ast.LtE: "<=",
        ast.Gt: ">",
        ast.GtE: ">=",
        ast.Eq: "==",
        ast.NotEq: "!=",
        ast.Is: "is",
        ast.IsNot: "is not",
        ast.In: "in",
        ast.NotIn: "not in",
        ast.Add: "+",
        ast.Sub: "-",
        ast.Mult: "*",
        ast.Div: "/",
        ast.FloorDiv: "//",
    }[type(op)]


def _sites(tree: ast.Module) -> Iterator[tuple[str, ast.AST, int, str]]:
    """Every (qualname, node, mutation number at that node, label), in a fixed order."""
    for qualname, function in _functions(tree):
        skip = _skipped(function)
        for stmt in function.body:
            for node in ast.walk(stmt):
                if id(node) in skip:
                    continue
                for number, (label, _) in enumerate(_site_mutations(node)):
                    yield qualname, node, number, label


_SOURCES: dict[str, str] = {}


def _source(module: str) -> str:
    """The module's source as read once, at the start (edits during a run do not count)."""
    if module not in _SOURCES:
        _SOURCES[module] = (ROOT / "httpx_bulkhead" / f"{module}.py").read_text()
    return _SOURCES[module]


def enumerate_mutants(module: str) -> list[Mutant]:
    source = _source(module)
    tree = ast.parse(source)
    lines = source.splitlines()
    mutants: list[Mutant] = []
    seen: dict[str, int] = {}
    for index, (qualname, node, _, label) in enumerate(_sites(tree)):
        line = getattr(node, "lineno", 0)
        text = lines[line - 1].strip() if line else ""
        base = f"{module}:{qualname}: {label}: {text}"
        seen[base] = seen.get(base, 0) + 1
        key = base if seen[base] == 1 else f"{base} (#{seen[base]})"
        mutants.append(Mutant(module, qualname, line, f"{label} in `{text}`", key, index))
    return mutants


def mutated_code(module: str, index: int) -> tuple[str, types.CodeType]:
    """The code object of the function mutated by site ``index``."""
    path = ROOT / "httpx_bulkhead" / f"{module}.py"
    tree = ast.parse(_source(module))
    sites = list(_sites(tree))
    qualname, node, number, _ = sites[index]
    apply = _site_mutations(node)[number][1]
    replacement = apply(node)
    _replace(tree, node, replacement)
    ast.fix_missing_locations(tree)
    code = compile(tree, str(path), "exec")
    return qualname, _find_code(code, qualname)


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST | None) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        if new is None:
                            value[i] = ast.Pass()
                            ast.copy_location(value[i], old)
                        else:
                            value[i] = new
                        return
            elif value is old:
                assert new is not None
                setattr(parent, field, new)
                return
    if new is not old:
        raise LookupError("mutation site not found")


def _find_code(code: types.CodeType, qualname: str) -> types.CodeType:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname:
                return const
            if qualname.startswith(const.co_qualname + "."):
                return _find_code(const, qualname)
    raise LookupError(qualname)


def _live_function(module: types.ModuleType, qualname: str) -> types.FunctionType:
    owner: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    attr = owner.__dict__[parts[-1]] if isinstance(owner, type) else getattr(owner, parts[-1])
    if isinstance(attr, property):
        attr = attr.fget
    if isinstance(attr, staticmethod | classmethod):
        attr = attr.__func__
    assert isinstance(attr, types.FunctionType), qualname
    return attr


# -- running ------------------------------------------------------------------------------
def _pytest_args(module: str, seed: int) -> list[str]:
    return [
        *TARGETS[module],
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--hypothesis-seed={seed}",
        "-o",
        "timeout=0",
        # the package and the tests were imported before pytest started (see ``_preload``)
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
    ]


class _Killer:
    """A pytest plugin that writes down the first failing test, and whether it draws
    examples from Hypothesis (its verdict may then depend on the seed)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed and not os.path.exists(self.path):
            with open(self.path, "w") as out:
                out.write(report.nodeid)

    def pytest_runtest_setup(self, item: Any) -> None:
        obj = getattr(item, "obj", None)
        cls = getattr(item, "cls", None)
        seeded = getattr(obj, "is_hypothesis_test", False) or hasattr(cls, "settings")
        self.seeded = bool(seeded)
        with open(self.path + ".current", "w") as out:  # read if the test never ends
            out.write("seeded" if seeded else "plain")

    def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
        if getattr(self, "seeded", True) and not os.path.exists(self.path + ".seeded"):
            with open(self.path + ".seeded", "w"):
                pass


def _child(module: str, seed: int, index: int | None, killer: str) -> int:
    import hypothesis
    import pytest

    # No example database (nothing carries over between runs) and no shrinking (a failure
    # is all the verdict needs; shrinking one can take many seconds).
    hypothesis.settings.register_profile(
        "mutation",
        database=None,
        deadline=None,
        print_blob=False,
        report_multiple_bugs=False,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    hypothesis.settings.load_profile("mutation")
    if index is not None:
        qualname, code = mutated_code(module, index)
        live = importlib.import_module(f"httpx_bulkhead.{module}")
        _live_function(live, qualname).__code__ = code
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    return int(pytest.main(_pytest_args(module, seed), plugins=[_Killer(killer)]))


def run_one(module: str, seed: int, index: int | None, cpu_limit: float) -> tuple[str, bool, float]:
    """Fork, run the tests against mutant ``index`` (``None``: unmutated).  Returns the
    verdict (``survived``, ``killed``, ``timeout`` or ``error``: the tests could not run),
    whether it may depend on the Hypothesis seed (the killing or looping test draws
    examples), and the CPU seconds the child used.

    A child that used more than ``cpu_limit`` CPU seconds loops: it is killed (``timeout``).
    CPU time, not wall time, so that a machine busy with other work is not taken for a
    loop (wall time is bounded too, at 50 times the limit)."""
    started = time.monotonic()
    killer = f"/tmp/mutation-killer-{os.getpid()}"
    for stale in (killer, killer + ".seeded", killer + ".current"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    pid = os.fork()
    if pid == 0:  # the child
        code = 3
        try:
            code = _child(module, seed, index, killer)
        finally:
            os._exit(code)
    tick = os.sysconf("SC_CLK_TCK")
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        if cpu > cpu_limit or time.monotonic() - started > 50 * cpu_limit:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            try:
                with open(killer + ".current") as current:
                    seeded = current.read() != "plain"
            except FileNotFoundError:
                seeded = True
            return "timeout", seeded, cpu
        time.sleep(0.05)
    cpu = usage.ru_utime + usage.ru_stime
    code = os.waitstatus_to_exitcode(status)
    verdict = {0: "survived", 1: "killed"}.get(code, "error")
    seeded = verdict != "killed" or os.path.exists(killer + ".seeded")
    return verdict, seeded, cpu


def _preload(modules: list[str]) -> None:
    """Import the package, its tests and their libraries once, before forking."""
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    import hypothesis  # noqa: F401
    import pytest  # noqa: F401

    for module in modules:
        _source(module)
        importlib.import_module(f"httpx_bulkhead.{module}")
        for test in TARGETS[module]:
            importlib.import_module(test.removesuffix(".py").replace("/", "."))


def run(
    modules: list[str], seeds: list[int], only: str | None, keys: set[str] | None = None
) -> dict[str, Any]:
    _preload(modules)
    results: dict[str, Any] = {"seeds": seeds, "modules": {}}
    for module in modules:
        mutants = enumerate_mutants(module)
        if only is not None:
            mutants = [m for m in mutants if only in m.key]
        if keys is not None:
            mutants = [m for m in mutants if m.key in keys]
        per_seed: dict[str, Any] = {}
        # A mutant killed by a test that draws no examples is killed whatever the seed:
        # only the others are run again with the next seeds.
        settled: set[str] = set()
        for seed in seeds:
            verdict, _, baseline = run_one(module, seed, None, cpu_limit=600)
            if verdict != "survived":
                raise SystemExit(f"{module}: the unmutated tests fail (seed {seed}): {verdict}")
            cpu_limit = max(5.0, 3 * baseline)
            verdicts: dict[str, str] = {}
            for number, mutant in enumerate(mutants, 1):
                if mutant.key in settled:
                    verdicts[mutant.key] = "killed"
                    mark = ","
                else:
                    verdict, seeded, _ = run_one(module, seed, mutant.index, cpu_limit)
                    verdicts[mutant.key] = verdict
                    if not seeded:
                        settled.add(mutant.key)
                    mark = "." if verdict == "killed" else verdict[0].upper()
                print(mark, end="", flush=True)
                if number % 80 == 0:
                    print(f" {number}/{len(mutants)}", flush=True)
            counts = {v: list(verdicts.values()).count(v) for v in set(verdicts.values())}
            print(f"\n{module} seed {seed}: {counts} (baseline {baseline:.1f} s CPU)", flush=True)
            per_seed[str(seed)] = {"baseline": baseline, "verdicts": verdicts}
        results["modules"][module] = {
            "mutants": [dataclasses.asdict(m) for m in mutants],
            "seeds": per_seed,
        }
    return results


# -- the report ---------------------------------------------------------------------------
def report(results: dict[str, Any]) -> str:
    judgements: dict[str, dict[str, str]] = {}
    if JUDGEMENTS.exists():
        judgements = tomllib.loads(JUDGEMENTS.read_text()).get("survivor", {})
    seeds = results["seeds"]
    rows = []
    survivors: list[tuple[dict[str, Any], list[str]]] = []
    unjudged = 0
    for module, data in results["modules"].items():
        mutants = data["mutants"]
        scores = []
        equivalent_keys = {  # judged equivalent, and alive with some seed
            m["key"]
            for m in mutants
            if judgements.get(m["key"], {}).get("verdict") == "equivalent"
            and any(data["seeds"][str(seed)]["verdicts"][m["key"]] == "survived" for seed in seeds)
        }
        for seed in seeds:
            verdicts = data["seeds"][str(seed)]["verdicts"]
            live = [m for m in mutants if verdicts[m["key"]] == "survived"]
            real = [m for m in live if m["key"] not in equivalent_keys]
            candidates = len(mutants) - len([m for m in live if m["key"] in equivalent_keys])
            scores.append((candidates - len(real), candidates, len(live)))
        worst = min(s[0] / s[1] if s[1] else 1.0 for s in scores)
        best = max(s[0] / s[1] if s[1] else 1.0 for s in scores)
        killed = ", ".join(f"{k}/{n}" for k, n, _ in scores)
        looped = max(
            list(data["seeds"][str(seed)]["verdicts"].values()).count("timeout") for seed in seeds
        )
        rows.append(
            f"| `{module}` | {len(mutants)} | {len(equivalent_keys)} | {killed} | {looped} | "
            f"{100 * worst:.1f} to {100 * best:.1f}% |"
        )
        for m in mutants:
            seeds_alive = [
                str(seed)
                for seed in seeds
                if data["seeds"][str(seed)]["verdicts"][m["key"]] == "survived"
            ]
            if seeds_alive:
                survivors.append((m, seeds_alive))
    lines = [
        "# Mutation testing of the pure core",
        "",
        "Generated by `scripts/mutation.py` (see its docstring for the operators and how to",
        "run it); judgements of the survivors live in `tests/mutation-judgements.toml`.",
        "",
        f"Hypothesis seeds: {', '.join(str(s) for s in seeds)}.  *Killed* counts the",
        "non-equivalent mutants the unit tests kill, per seed.  A mutant whose tests use more",
        "than three times the CPU time of the unmutated tests (at least 5 s) loops and counts",
        "as killed; *timeouts* says how many did so (most with any one seed).  A mutant killed",
        "(or looping) in a test that draws no Hypothesis examples is so with every seed and is",
        "not run again.",
        "",
        "The codecs: `_h2frames` (the splitter that takes GOAWAY frames out of the HTTP/2",
        "byte stream) and `_codec` (the two HTTP/1.1 codecs behind one interface: the h11",
        "adapter and the httptools one, whose request framing, chunked encoding and",
        "keep-alive verdicts are ours).  Chunked *decoding* and HPACK are done by h11,",
        "httptools and h2 themselves: this package has no decoder of its own to mutate.",
        "",
        "| module | mutants | equivalent | killed (per seed) | timeouts | score (seed range) |",
        "|---|---:|---:|---|---:|---|",
        *rows,
        *(
            f"| `{module}` | not run yet | | | | |"
            for module in TARGETS
            if module not in results["modules"]
        ),
        *(
            [
                "",
                "Not run yet: "
                + ", ".join(f"`{m}`" for m in TARGETS if m not in results["modules"])
                + " (`python scripts/mutation.py --modules "
                + " ".join(m for m in TARGETS if m not in results["modules"])
                + "`; see tests/README.md for why).",
            ]
            if any(m not in results["modules"] for m in TARGETS)
            else []
        ),
        "",
        "## Survivors",
        "",
        "| mutant | survived with seed | judgement |",
        "|---|---|---|",
    ]
    for m, alive in survivors:
        judgement = judgements.get(m["key"])
        if judgement is None:
            unjudged += 1
            text = "**not judged**"
        elif judgement.get("verdict") == "equivalent":
            text = f"equivalent: {judgement.get('why', '')}"
        else:
            text = f"{judgement.get('verdict')}: {judgement.get('why', '')}"
        where = f"`{m['module']}.py:{m['line']}` `{m['qualname']}`: {m['description']}"
        where = where.replace("|", "\\|")
        lines.append(f"| {where} | {', '.join(alive)} | {text} |")
    if not survivors:
        lines.append("| (none) | | |")
    if unjudged:
        lines += ["", f"**{unjudged} survivor(s) not judged yet.**"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modules", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--seeds", nargs="*", type=int, default=list(DEFAULT_SEEDS))
    parser.add_argument("--only", help="run only mutants whose key contains this text")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report")
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="run again only the mutants that survived the last full run; print the ones "
        "that still survive (the results and the report are left as they are)",
    )
    args = parser.parse_args()
    if args.survivors:
        last = json.loads(RESULTS.read_text())
        keys = {
            key
            for module in args.modules
            for seed in last["modules"].get(module, {}).get("seeds", {}).values()
            for key, verdict in seed["verdicts"].items()
            if verdict == "survived"
        }
        again = run(args.modules, args.seeds, None, keys)
        for data in again["modules"].values():
            for seed, outcome in data["seeds"].items():
                for key, verdict in outcome["verdicts"].items():
                    if verdict == "survived":
                        print(f"seed {seed}: {key}")
        return
    if args.list:
        for module in args.modules:
            for mutant in enumerate_mutants(module):
                print(mutant.key)
        return
    if not args.report_only:
        fresh = run(args.modules, args.seeds, args.only)
        if args.only is None:
            old: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
            if old.get("seeds") == fresh["seeds"]:
                old["modules"].update(fresh["modules"])
                fresh = old
            RESULTS.write_text(json.dumps(fresh, indent=1))
    REPORT.write_text(report(json.loads(RESULTS.read_text())))
    print(f"wrote {REPORT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
