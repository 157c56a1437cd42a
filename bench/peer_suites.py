"""The peers' own test suites against layerscope's drop-ins (issue 38): each suite is checked out from
the peer's repository at its tag and run twice with pytest, once as it is (the real package, from that
checkout) and once with the package's import name aliased to layerscope's front end, the way a user's
one-line swap does (``import torchinfo`` -> ``layerscope.compat.torchinfo``). Prints, per suite, the
tests the real package passes, those the front end passes too, and those it fails: each either listed
in docs/compat.md's table of documented differences (its only difference a number layerscope counts
another way, with the reason) or a failure to fix.

  python bench/peer_suites.py [--only torchinfo,torchinfo-xl,torchscan,torchscan-0.1,deepspeed]
                              [--source NAME=PATH_OR_URL] [--keep DIR] [-v]

Suites: torchinfo (v1.8.0), torchinfo-xl (its tests that need torchvision), torchscan (torch-scan 0.2:
the newest commit of its main branch, there being no v0.2.0 tag), torchscan-0.1 (v0.1.2), deepspeed
(v0.19.8's flops-profiler tests). Run by hand, not by CI. ``--source`` names a clone or mirror of the
repository (default: the peer's GitHub address); the revision is checked out from it, nothing is
vendored. Both runs use this interpreter (the project's .venv: torch, numpy, pytest) or the suite's own
environment, made on first use (deepspeed: bench/.venv-peers, as bench/peers.py makes it;
torchinfo-xl: bench/.venv-xl, torch 2.14.1 + torchvision 0.29.1 as `make test-torch214`, with
transformers and compressai); tests that need what it lacks (a GPU, the network) fail or skip alike on
both sides and are not counted; a suite's ``deselect`` leaves out of both runs what needs more than the
front end offers (a DeepSpeed engine), each with its reason, printed with the counts.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMPAT_DOC = ROOT / "docs" / "compat.md"

# torchinfo 1.8.0 predates Python 3.11, where format() of a (str, Enum) member gives its name
# ("Total mult-adds (Units.MEGABYTES)"): on this interpreter the real package fails 52 of its own
# tests for that alone. Its run gets back the format it was written for (each member formats as its
# value), so that the count is of what it computes; the front end prints "(M)" either way.
PY310_ENUMS = """\
import torchinfo.enums as e
for cls in (e.Units, e.ColumnSettings, e.RowSettings, e.Mode):
    cls.__str__ = lambda self: str.__str__(self)
    cls.__format__ = lambda self, spec: format(str.__str__(self), spec)
"""

SUITES = {
    # rev: the tag (or commit) checked out; package: the peer's own package in the checkout, removed for the
    # front end's run (None: keep it, only the aliased modules are replaced); alias: peer module -> front end
    # module (each aliased module's submodules follow, at every depth); outputs: where a test's golden output
    # lives (its name without "test_"), and overwrite the pytest option that makes the suite write what it
    # printed there instead of comparing (None: the suite has no printed goldens); python: the interpreter
    # (default this one); metadata: (name, version) of a dist-info the real run needs (a package that reads
    # its own version)
    "torchinfo": dict(url="https://github.com/TylerYep/torchinfo", rev="v1.8.0", package="torchinfo",
                      alias={"torchinfo": "layerscope.compat.torchinfo"}, tests="tests", real_plugin=PY310_ENUMS,
                      outputs="tests/test_output/{}.out", overwrite="--overwrite"),
    # torchinfo's tests that need torchvision (and transformers, compressai), in the torch 2.14.1 +
    # torchvision 0.29.1 environment of `make test-torch214`, made for the harness in bench/.venv-xl;
    # table: the rows of docs/compat.md's torchinfo table apply
    "torchinfo-xl": dict(url="https://github.com/TylerYep/torchinfo", rev="v1.8.0", package="torchinfo",
                         alias={"torchinfo": "layerscope.compat.torchinfo"}, tests="tests/torchinfo_xl_test.py",
                         real_plugin=PY310_ENUMS, outputs="tests/test_output/{}.out", overwrite="--overwrite",
                         table="torchinfo", python=str(ROOT / "bench" / ".venv-xl" / "bin" / "python"),
                         venv=["torch==2.14.1", "torchvision==0.29.1", "transformers", "compressai", "numpy",
                               "packaging", "pytest", "-e", str(ROOT)]),
    "torchscan-0.1": dict(url="https://github.com/frgfm/torch-scan", rev="v0.1.2", package="torchscan",
                          alias={"torchscan": "layerscope.compat.torchscan01"}, tests="tests"),
    # torchscan 0.2: the repository has no v0.2.0 tag (2026-11-27); its newest commit of main, 0.2.0.dev0
    # ("Unreleased (0.2.0)" in its changelog). pip's 0.2.0 wheel passes 148 of the 149 tests this
    # commit's own package passes. Its package reads its version from the installed metadata: the
    # real run gets a dist-info for it.
    "torchscan": dict(url="https://github.com/frgfm/torch-scan", rev="6431b493ae7293e52f22e475f2f591760b559ecd",
                      package="torchscan", alias={"torchscan": "layerscope.compat.torchscan"}, tests="tests",
                      metadata=("torchscan", "0.2.0.dev0")),
    # DeepSpeed's own package stays (an engine, its accelerator, the test helpers need it); only the
    # profiler module is the front end. args: tests/pytest.ini's addopts leave out the tests marked
    # `sequential` (every flops-profiler test but the DistributedTest class; DeepSpeed's CI runs them in
    # a second pass), -m "" runs them all. children: the alias also in the suite's subprocesses
    # (DistributedTest runs each test in a forkserver child, which imports the test module afresh).
    # installed: the checkout's copy of the package removed from both runs, so that the one pip installed
    # (bench/requirements-peers.txt's pin) is the one imported (the checkout's root is on sys.path, put
    # there by the harness and by DeepSpeed's tests/conftest.py, and its source has no built ops).
    # deselect: tests left out of the counts of both runs (by the end of their id, exactly: pytest's own
    # --deselect takes a prefix, and TestFlopsProfiler::test is one of its other tests' ids), with the reason.
    "deepspeed": dict(url="https://github.com/deepspeedai/DeepSpeed", rev="v0.19.8", package=None,
                      alias={"deepspeed.profiling.flops_profiler": "layerscope.compat.deepspeed"},
                      tests="tests/unit/profiling/flops_profiler", args=["-m", ""], children=True,
                      installed="deepspeed",
                      python=str(ROOT / "bench" / ".venv-peers" / "bin" / "python"),   # bench/peers.py's
                      venv=["torch==2.13.0", "-r", str(ROOT / "bench" / "requirements-peers.txt"), "-e", str(ROOT),
                           "pytest"],  # the suite runs in this environment: bench/peers.py does not need pytest
                      deselect={"TestFlopsProfiler::test": "deepspeed.initialize: a real engine's fp16 training "
                                "steps (out of scope, issue 38; skipped on CPU either way: no fp16)"}),
}

# A pytest plugin, loaded with -p in the front end's run: the peer's import name and its submodules
# are layerscope's front end and its submodules (torchinfo.enums is layerscope.compat.torchinfo.enums).
ALIAS = '''\
import importlib, pkgutil, sys

for peer, front in {alias!r}.items():
    parent, _, leaf = peer.rpartition(".")
    if parent:                      # a submodule of a package kept real: the package first, whole (its own
        importlib.import_module(parent)     # imports of the submodule get the real one), then its attribute
    mod = importlib.import_module(front)
    sys.modules[peer] = mod
    if parent:
        setattr(sys.modules[parent], leaf, mod)
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), prefix=front + "."):
        sys.modules[peer + info.name[len(front):]] = importlib.import_module(info.name)
'''


def make_venv(where: pathlib.Path, packages: list[str]) -> None:
    """A virtual environment for a suite that needs packages the project's own does not have."""
    print(f"setting up {where} (once): {' '.join(packages)}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    subprocess.run([str(where / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *packages], check=True)


def checkout(source: str, rev: str, dest: pathlib.Path) -> None:
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", source, str(dest)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", rev], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_pytest(python: str, where: pathlib.Path, tests: str, plugin: str | None, verbose: bool,
               *extra: str) -> dict[str, str]:
    """Each test's outcome (passed, failed, error, skipped) by its id, from pytest's JUnit XML; the
    failures' messages in ``messages[where]``."""
    xml = where / "_results.xml"
    cmd = [python, "-m", "pytest", *tests.split(), "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "-o", "junit_family=xunit1", "--no-header", "-rN", "--continue-on-collection-errors", *extra]
    if plugin:
        cmd[3:3] = ["-p", plugin]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")])),
               PYTHONDONTWRITEBYTECODE="1")
    res = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True)
    if verbose:
        print(res.stdout[-3000:], res.stderr[-2000:], sep="\n", file=sys.stderr)
    out: dict[str, str] = {}
    said = messages.setdefault(str(where), {})
    if not xml.exists():
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        tid = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        out[tid] = ("failed" if "failure" in kinds else "error" if "error" in kinds else
                    "skipped" if "skipped" in kinds else "passed")
        said[tid] = " ".join((c.get("message") or "") + " " + (c.text or "") for c in case
                             if c.tag in ("failure", "error"))
    return out


messages: dict[str, dict[str, str]] = {}


def documented(suite: str) -> tuple[dict[str, tuple[str, set[str]]], dict[str, str]]:
    """docs/compat.md's table of documented differences, rows ``| suite | test or figure | peer's | layerscope's
    | reason |``: (tests -> (reason, the figures named in backticks in its peer's cell), printed figures ->
    reason). A figure is a column title or the start of a footer line (``Total mult-adds``), whose values
    the comparison of printed outputs leaves out (a test's own figures in its output only)."""
    tests: dict[str, tuple[str, set[str], str]] = {}
    figures: dict[str, str] = {}
    for line in COMPAT_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[0] != suite:
            continue
        name = cells[1].strip("`")
        if name.startswith("test_"):
            # layerscope's value, which the failure must show: the cell's first word in backticks (a
            # status: `complete`), else its first number
            word = re.search(r"`([^`]+)`", cells[3])
            value = word.group(1) if word else (m.group().replace(",", "").rstrip(".")
                                                if (m := re.search(r"\d[\d,.]*", cells[3])) else "")
            tests[name] = (cells[-1], set(re.findall(r"`([^`]+)`", cells[2])), value)
        else:
            figures[name] = cells[-1]
    return tests, figures


def masked(text: str, figures) -> list[str]:
    """The printed output's lines with the documented figures' values blanked: the cells under those
    column titles (each column as wide as the header lays them out), the values of footer lines that
    start with them."""
    out = []
    spans: list[tuple[int, int | None]] = []
    for line in text.splitlines():
        if line.startswith("Layer (type"):       # each table's own header gives its columns' places
            titles = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", line)]
            spans = [(start, titles[i + 1][0] if i + 1 < len(titles) else None)
                     for i, (start, title) in enumerate(titles) if title in figures]
            out.append(line)
            continue
        foot = next((f for f in figures if line.startswith(f)), None)
        if foot is not None:
            line = foot + ": #"
        elif not line.startswith("="):
            for start, end in spans:
                if len(line) > start:
                    line = line[:start] + "#" + (line[end:] if end is not None and len(line) > end else "")
        out.append(line)
    return out


def short(tid: str) -> str:
    return tid.rpartition("::")[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SUITES))
    ap.add_argument("--source", action="append", default=[], help="NAME=PATH_OR_URL of the repository")
    ap.add_argument("--keep", help="check out into this folder and keep it")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    sources = dict(s.split("=", 1) for s in a.source)
    base = pathlib.Path(a.keep) if a.keep else pathlib.Path(tempfile.mkdtemp(prefix="peer-suites-"))
    try:
        for name in a.only.split(","):
            s = SUITES[name]
            real, front = base / f"{name}-real", base / f"{name}-front"
            for d in (real, front):
                if d.exists():
                    shutil.rmtree(d)
                checkout(sources.get(name, s["url"]), s["rev"], d)
            if s["package"]:
                shutil.rmtree(front / s["package"])     # the front end's run must not find the real one
            for d in (real, front) if s.get("installed") else ():
                shutil.rmtree(d / s["installed"], ignore_errors=True)
            (front / "_layerscope_alias.py").write_text(ALIAS.format(alias=s["alias"]))
            if s.get("children"):     # run at start-up by every Python the suite starts (PYTHONPATH has it)
                (front / "sitecustomize.py").write_text(ALIAS.format(alias=s["alias"]))
            extra = list(s.get("args", ()))
            python = s.get("python", sys.executable)
            if s.get("venv") and not pathlib.Path(python).exists():
                make_venv(pathlib.Path(python).parents[1], s["venv"])
            fronts = ", ".join(s["alias"].values())
            if s.get("metadata"):
                dist = real / "{}-{}.dist-info".format(*s["metadata"])
                dist.mkdir()
                (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: {}\nVersion: {}\n".format(*s["metadata"]))
            plugin = None
            if s.get("real_plugin"):
                (real / "_as_written.py").write_text(s["real_plugin"])
                plugin = "_as_written"
            print(f"{name} {s['rev']}: running the real package's suite", file=sys.stderr, flush=True)
            r = run_pytest(python, real, s["tests"], plugin, a.verbose, *extra)
            print(f"{name} {s['rev']}: running it against {fronts}", file=sys.stderr, flush=True)
            f = run_pytest(python, front, s["tests"], "_layerscope_alias", a.verbose, *extra)
            # again, each test's printed output written where its golden one was (not compared): a test
            # that passes so, and whose output equals the golden one but for documented figures, differs
            # only by those numbers
            g = (run_pytest(python, front, s["tests"], "_layerscope_alias", a.verbose, *extra, s["overwrite"])
                 if s.get("overwrite") else {})
            for res in (r, f, g):
                for t in [t for t in res if any(t.endswith(d) for d in s.get("deselect", {}))]:
                    del res[t]
            tests, figures = documented(s.get("table", name))
            passed = sorted(t for t, o in r.items() if o == "passed")
            verdict: dict[str, str] = {}
            for t in passed:
                out = s["outputs"].format(short(t).replace("test_", "", 1)) if s.get("outputs") else "-"
                reason, own, value = tests.get(short(t), ("", set(), ""))
                mine = figures.keys() | own
                theirs = ours = want = got = None
                if s.get("outputs") and (real / out).exists() and (front / out).exists():
                    theirs, ours = (real / out).read_text(), (front / out).read_text()
                    want, got = masked(theirs, mine), masked(ours, mine)
                same = None if want is None else want == got   # the same but for documented figures
                # a test the table names: its output the same but for the figures, and it passes with the
                # output not compared, or its failure there shows layerscope's value from the table
                shows = bool(value) and value in messages[str(front)].get(t, "").replace(",", "")
                if f.get(t) == "passed":
                    verdict[t] = "passes"
                elif short(t) in tests and same is not False and (g.get(t) == "passed" or shows):
                    verdict[t] = "documented: " + reason
                elif short(t) in tests:
                    why = "its output differs" if same is False else f"its failure does not show {value!r}"
                    verdict[t] = f"fails: named in docs/compat.md, but {why}"
                elif g.get(t) == "passed" and same is not None:
                    if same:
                        differ = [x for x in sorted(figures)
                                  if masked(theirs, set(figures) - {x}) != masked(ours, set(figures) - {x})]
                        verdict[t] = ("documented: its printed output differs only in " + ", ".join(differ) if differ
                                      else "fails: the comparing run failed, the output matches (flaky?)")
                    else:
                        diff = sum(1 for x, y in zip(want, got) if x != y) + abs(len(want) - len(got))
                        verdict[t] = f"fails: its printed output differs in {diff} lines besides documented figures"
                else:
                    verdict[t] = f"fails: {f.get(t, 'not run')}" + (" (also with its output not compared)"
                                                                     if g.get(t) != "passed" else "")
            n = {k: sum(1 for v in verdict.values() if v.startswith(k)) for k in ("passes", "documented", "fails")}
            print(f"\n{name} {s['rev']}: {len(r)} tests; the real package passes {len(passed)}; the front end "
                  f"passes {n['passes']} of them, {n['documented']} more differ only by a documented number, "
                  f"{n['fails']} fail")
            for kind in ("fails", "documented"):
                for t, v in verdict.items():
                    if v.startswith(kind):
                        print(f"  {short(t)}: {v}")
            for t, why in s.get("deselect", {}).items():
                print(f"  left out of both counts: {t}: {why}")
            ran = {short(t) for t in r}        # a table shared by two suites names the other's tests too
            for t in sorted((set(tests) & ran) - {short(t) for t, v in verdict.items() if v.startswith("documented")}):
                print(f"  documented in docs/compat.md but not failing here: {t}")
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
