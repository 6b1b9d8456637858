"""The README's commands work as printed (issue 16): every command of its fenced blocks
is run, in README order, in one fresh working directory, against the test web its own
``python -m tools.testweb serve`` line starts.

The README is parsed at test time (tests/readme_blocks.py), so a command added to it is
run here too; one the test does not know how to run fails, naming its line, instead of
going untested. What is changed before a command runs, and nothing else:

- the test web's ports are 0 (any free port: a fixed one may be taken on the machine),
  and the values it prints (ports, nameserver, CA file) replace the README's in later
  commands; ``serve`` commands get port 0 for the same reason, and their printed URL is
  probed;
- the placeholders of PLACEHOLDERS get real values;
- commands in ALLOWED_SKIPS are not run (each says why): the installs and the test
  command, which .ci/run runs as printed in a fresh venv instead (it reads the README's
  "Install and first crawl" and "Run the tests" sections with tests/readme_blocks.py;
  tests/test_packaging.py checks that it does).

Each command is run with ``bash -c`` (so ``> dump.txt`` works as printed) and ``python``
on PATH being this test's interpreter; PYTHONPATH is the checkout, which stands in for
"from its top directory" (``tools`` is not installed) while the cwd stays fresh. TMPDIR
is a directory of the test's own, so what a command leaves in a temporary directory (the
demo's crawl, the test web's CA) goes with the test's files.

One module-scoped fixture runs everything in order (later commands read what earlier
ones made: crawl1, dump.txt, the store of the Python example) and records each result;
one test per command, named by README line, asserts on its record. So every broken line
is reported at once, each under its own line, and the crawl runs once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
import readme_blocks as rb

import kvstore

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

COMMAND_TIMEOUT = 120.0  # any one command (the README's crawl takes ~15 s on 2 cores)
START_TIMEOUT = 30.0  # a server printing where it listens
STOP_TIMEOUT = 30.0  # a server exiting after its signal

# Commands (or the parts of one joined by ``&&``) that are not run, and why.
ALLOWED_SKIPS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^pip3? install\b"),
     "CI installs the project itself (.ci/run); the suite cannot reinstall the venv it runs in"),
    (re.compile(r"^([A-Za-z_]\w*=\S*\s+)*python3? -m pytest\b"),
     "the test suite itself: CI runs it; run from inside the suite it would recurse"),
    (re.compile(r"^tools/install-system-packages$"),
     "installs system packages with apt-get as root: CI runs it (.ci/run), and a test whose "
     "package is missing skips naming it"),
]

# Modules whose commands run to their end; ``serve`` of any of them is a server instead.
RUNNABLE_MODULES = frozenset({"crawler", "kvstore", "tools.testweb", "warcio", "warcio.cli"})
# Programs a README command may pipe into (``... | head``).
PIPE_FILTERS = frozenset({"head", "tail", "grep", "wc", "sort", "cut"})
PORT_OPTIONS = {  # the port options of each module's ``serve``, set to 0
    "tools.testweb": ("--port", "--https-port", "--dns-port"),
    "crawler": ("--port",),
}


def _live_key(workdir: Path, path: str) -> str:
    with kvstore.open(workdir / path, readonly=True) as db:
        return next(iter(db)).hex()


# Placeholders of the README's commands -> their value (computed when the command runs,
# from the working directory).
PLACEHOLDERS: dict[str, Callable[[Path], str]] = {
    # kvstore's PATH: the store the README's "kvstore in five lines" example creates.
    "PATH": lambda workdir: "data/main",
    # HEXKEY: a key that store holds (the example's md5 key of its URL).
    "HEXKEY": lambda workdir: _live_key(workdir, "data/main"),
    # DIR: a crawl directory, the one the README's crawl makes.
    "DIR": lambda workdir: "crawl1",
}


def _is_program(word: str) -> bool:
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    return (word in ("python", "python3", "pip", "pip3") or shutil.which(word, path=path)
            is not None or (REPO / word).is_file())


@dataclass(frozen=True)
class Plan:
    """What to do with one README command."""

    command: rb.Command
    code: str  # the code to run (skipped ``&&`` parts removed), placeholders still in
    kind: str  # "run", "python", "web" (the test web), "serve" (probed), "unknown"
    why: str = ""  # for "unknown": what the test does not know


def _plan_part(part: str, after_pipe: bool) -> tuple[str, str]:
    """(kind, why) of one command of a pipeline."""
    try:
        w = rb.words(part)
    except ValueError as exc:  # unbalanced quotes
        return "unknown", f"not shell words: {exc}"
    prog = rb.program(w)
    if after_pipe and prog in PIPE_FILTERS:
        return "run", ""
    if prog not in ("python", "python3") or len(w) < 3 or w[w.index(prog) + 1] != "-m":
        return "unknown", f"{prog!r} is not a `python -m` command"
    module = w[w.index(prog) + 2]
    if module not in RUNNABLE_MODULES:
        return "unknown", f"module {module!r} is not one the test runs"
    sub = w[w.index(prog) + 3] if len(w) > w.index(prog) + 3 else ""
    if sub == "serve":
        if module not in PORT_OPTIONS:
            return "unknown", f"`{module} serve`: its port options are not known"
        return ("web" if module == "tools.testweb" else "serve"), ""
    return "run", ""


def plan(command: rb.Command) -> Plan | None:
    """How to run a command; None if ALLOWED_SKIPS leaves nothing of it."""
    if command.python:
        return Plan(command, command.text, "python")
    parts = [p for p in re.split(r"\s&&\s", command.code)
             if not any(pattern.match(p.strip()) for pattern, _ in ALLOWED_SKIPS)]
    if not parts:
        return None
    code = " && ".join(p.strip() for p in parts)
    pieces = re.split(r"\s(&&|\|\||;|\|)\s", code)  # command, separator, command...
    pipeline = pieces[::2]
    kinds = [_plan_part(p, i > 0 and pieces[i - 1] == "|") for i, p in enumerate(pieces)
             if i % 2 == 0]
    unknown = [why for kind, why in kinds if kind == "unknown"]
    if unknown:
        return Plan(command, code, "unknown", "; ".join(unknown))
    servers = [kind for kind, _ in kinds if kind in ("web", "serve")]
    if servers and len(pipeline) > 1:
        return Plan(command, code, "unknown", "a server inside a compound command")
    return Plan(command, code, servers[0] if servers else "run")


PLANS = [p for p in map(plan, rb.commands(README.read_text(), _is_program)) if p is not None]


@dataclass
class Result:
    plan: Plan
    ran: str = ""  # the code as run, substitutions made
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def report(self) -> str:
        c = self.plan.command
        return (f"README.md line {c.line}: {c.text}\n  as run: {self.ran or '(not run)'}\n"
                f"  exit: {self.returncode} after {self.seconds:.1f} s\n"
                f"  problems: {'; '.join(self.problems)}\n"
                f"  stdout (end): {self.stdout[-1500:]}\n  stderr (end): {self.stderr[-2500:]}")


class _Reader:
    """A running process's pipe, read as it comes by a daemon thread."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None
        self.chunks: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                self.chunks.append(line)

    def text(self, join: bool = False) -> str:
        if join:
            self._thread.join(STOP_TIMEOUT)
        return "".join(self.chunks)


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str]) -> bool:
    deadline = time.monotonic() + START_TIMEOUT
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            return condition()
        time.sleep(0.05)
    return True


class _Background:
    """A server command running beside the others."""

    def __init__(self, code: str, cwd: Path, env: dict[str, str]) -> None:
        # exec: the signal goes to the server itself, not to a shell around it
        self.proc = subprocess.Popen(["bash", "-c", "exec " + code], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.out, self.err = _Reader(self.proc.stdout), _Reader(self.proc.stderr)

    def wait_printed(self, pattern: str) -> re.Match[str] | None:
        _wait_for(lambda: re.search(pattern, self.out.text(), re.M) is not None, self.proc)
        return re.search(pattern, self.out.text(), re.M)

    def stop(self, signum: int, result: Result) -> None:
        if self.proc.poll() is not None:
            result.problems.append(f"exited {self.proc.returncode} before it was stopped")
        else:
            self.proc.send_signal(signum)
        try:
            result.returncode = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            result.returncode = self.proc.wait(STOP_TIMEOUT)
            result.problems.append(f"did not exit within {STOP_TIMEOUT:.0f} s of signal {signum}")
        result.stdout, result.stderr = self.out.text(join=True), self.err.text(join=True)
        if result.returncode != 0:
            result.problems.append(f"exit {result.returncode} (stopped by signal {signum}), not 0")


def _poll_page(url: str, proc: subprocess.Popen[str]) -> str | None:
    """None once GET ``url`` answers 200 with a real page of HTML; else what it answered.
    A server may first answer a short page while it computes (a "wait" page, refreshing
    itself): the report is hundreds of kB, a wait or error page a line."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
    last = "no answer"
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        with opener.open(url, timeout=START_TIMEOUT) as resp:
            body, kind = resp.read(), resp.headers.get("Content-Type", "")
            if resp.status == 200 and "html" in kind and b"<html" in body[:1000].lower():
                if len(body) >= 10_000:
                    return None
            last = f"{resp.status} {kind!r}, {len(body)} bytes: {body[:200]!r}"
        time.sleep(0.5)
    return last


class _Run:
    """Runs the plans in order, in one working directory."""

    def __init__(self, workdir: Path, bindir: Path, tmpdir: Path) -> None:
        self.workdir = workdir
        self.env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmpdir))
        self.env["PATH"] = f"{bindir}{os.pathsep}{os.path.dirname(sys.executable)}" \
                           f"{os.pathsep}{self.env.get('PATH', '')}"
        self.web: rb.WebValues | None = None
        self.web_proc: _Background | None = None
        self.web_result: Result | None = None
        self.readme_ports: dict[str, str | None] = {}

    def prepare(self, result: Result) -> str | None:
        """The code to run, substitutions made (None, with a problem, if it cannot run)."""
        code = result.plan.code
        if result.plan.kind == "python":
            return code
        if rb.uses_web(code, self.readme_ports):
            if self.web is None:
                result.problems.append("it uses the test web, which is not running (see the "
                                       "README's `python -m tools.testweb serve` line)")
                return None
            code = self.web.substitute(code)
        unknown = sorted({p for p in rb.placeholders(code) if p not in PLACEHOLDERS})
        if unknown:
            result.problems.append(f"placeholder(s) {unknown} not in test_readme.PLACEHOLDERS")
            return None
        try:
            values = {name: PLACEHOLDERS[name](self.workdir) for name in rb.placeholders(code)}
        except Exception as exc:  # the store or crawl it needs was not made
            result.problems.append(f"a placeholder has no value: {exc!r}")
            return None
        return rb.fill_placeholders(code, values)

    def run(self, plan: Plan) -> Result:
        result = Result(plan)
        if plan.kind == "unknown":
            result.problems.append(f"the test does not know how to run this command ({plan.why}): "
                                   "teach test_readme.py, or add it to ALLOWED_SKIPS with a reason")
            return result
        code = self.prepare(result)
        if code is None:
            return result
        if plan.kind == "web":
            self._start_web(result, code)
        elif plan.kind == "serve":
            self._probe_server(result, code)
        else:
            self._run_to_end(result, code)
        return result

    def _run_to_end(self, result: Result, code: str) -> None:
        python = result.plan.kind == "python"
        args = ["python", "-"] if python else ["bash", "-c", code]
        result.ran = "python - <<README-BLOCK" if python else code
        # A session of its own: a timeout kills the command's whole process group (a
        # crawl's shards, a pipeline), not only the shell.
        proc = subprocess.Popen(args, cwd=self.workdir, env=self.env, text=True,
                                stdin=subprocess.PIPE if python else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            result.stdout, result.stderr = proc.communicate(code if python else None,
                                                            timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            result.stdout, result.stderr = proc.communicate()
            result.problems.append(f"still running after {COMMAND_TIMEOUT:.0f} s: killed")
        result.returncode = proc.returncode
        if proc.returncode != 0 and not result.problems:
            result.problems.append(f"exit {proc.returncode}, not 0")

    def _start_web(self, result: Result, code: str) -> None:
        if self.web_proc is not None:
            result.problems.append("a second test web: test_readme.py runs one per README")
            return
        result.ran = rb.with_ports_zero(code, PORT_OPTIONS["tools.testweb"])
        self.readme_ports = {o: rb.option_value(rb.words(code), o)
                             for o in PORT_OPTIONS["tools.testweb"]}
        self.web_proc, self.web_result = _Background(result.ran, self.workdir, self.env), result
        if self.web_proc.wait_printed(r"^ca: \S+") is None:
            result.problems.append(f"printed no `ca:` line within {START_TIMEOUT:.0f} s")
            return
        try:
            self.web = rb.WebValues.parse(self.web_proc.out.text(), rb.words(code))
        except ValueError as exc:
            result.problems.append(str(exc))

    def _probe_server(self, result: Result, code: str) -> None:
        w = rb.words(code)
        module = w[w.index("-m") + 1]
        result.ran = rb.with_ports_zero(code, PORT_OPTIONS[module])
        server = _Background(result.ran, self.workdir, self.env)
        try:
            found = server.wait_printed(r"http://(127\.\d+\.\d+\.\d+):(\d+)/?")
            if found is None:
                result.problems.append(f"printed no http://127.x.x.x:PORT/ URL within "
                                       f"{START_TIMEOUT:.0f} s")
                return
            url = f"http://{found.group(1)}:{found.group(2)}/"
            answer = _poll_page(url, server.proc)
            if answer is not None:
                result.problems.append(f"GET {url}: {answer}")
        except OSError as exc:
            result.problems.append(f"GET / failed: {exc!r}")
        finally:
            server.stop(signal.SIGINT, result)  # Ctrl-C, as the README says

    def stop_web(self) -> None:
        if self.web_proc is not None and self.web_result is not None:
            self.web_proc.stop(signal.SIGTERM, self.web_result)


def _one_line_per_page(res: Result, m: re.Match[str], run: _Run) -> str | None:
    n = len(res.stdout.splitlines())
    return None if 1 <= n <= int(m.group(1)) else f"{n} lines, not 1..{m.group(1)} (one a page)"


def _shows_url(res: Result, m: re.Match[str], run: _Run) -> str | None:
    return None if re.search(rf"^url:\s+{re.escape(m.group(1))}$", res.stdout, re.M) else (
        f"no `url: {m.group(1)}` line")


def _says_state(res: Result, m: re.Match[str], run: _Run) -> str | None:
    said = re.search(r"\b(running|finished|interrupted|killed)\b", res.stdout)
    return None if said else "says none of running, finished, interrupted or killed"


def _warcs_check(res: Result, m: re.Match[str], run: _Run) -> str | None:
    wrote = [name for line in re.findall(r"^wrote (.+)$", res.stdout, re.M)  # docs/EXPORT.md
             for name in line.split() if re.search(r"\.warc(\.gz)?$", name)]
    if not wrote:
        return "no `wrote FILE.warc.gz` line"
    for name in wrote:  # the README: "`python -m warcio.cli check` passes on it"
        done = subprocess.run(["python", "-m", "warcio.cli", "check", name], cwd=run.workdir,
                              env=run.env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT)
        if done.returncode != 0:
            return f"`python -m warcio.cli check {name}`: exit {done.returncode}: " + (
                done.stderr[-500:])
    return None


def _json_lines(res: Result, m: re.Match[str], run: _Run) -> str | None:
    path = run.workdir / m.group(1)
    if not path.is_file():
        return f"no file {m.group(1)}"
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.startswith("{") or not isinstance(json.loads(line), dict):
                return f"{m.group(1)} line {number} is not a JSON object"
    return None


def _wacz_package(res: Result, m: re.Match[str], run: _Run) -> str | None:
    try:
        with zipfile.ZipFile(run.workdir / m.group(1)) as z:
            package = json.loads(z.read("datapackage.json"))
    except (zipfile.BadZipFile, KeyError) as exc:
        return f"{m.group(1)}: not a WACZ: {exc}"
    if package.get("wacz_version") != "1.1.1":
        return f"{m.group(1)}: no WACZ 1.1.1 datapackage.json"
    return None


def _html_file(res: Result, m: re.Match[str], run: _Run) -> str | None:
    path = run.workdir / m.group(1)
    if not path.is_file() or b"<html" not in path.read_bytes()[:1000].lower():
        return f"{m.group(1)} is not an HTML file"
    return None


def _demo_made(res: Result, m: re.Match[str], run: _Run) -> str | None:
    """The demo's report is an HTML file in a new directory under TMPDIR, beside the crawl
    that status reads as finished."""
    wrote = re.search(r"^demo: wrote the report: (\S+)$", res.stdout, re.M)
    if wrote is None:
        return "no `demo: wrote the report: FILE` line"
    report = Path(wrote.group(1))
    if report.parent.parent != Path(run.env["TMPDIR"]) or report.suffix != ".html":
        return f"the report {report} is not an .html file in a new directory under TMPDIR"
    if b"<html" not in report.read_bytes()[:1000].lower():
        return f"{report} is not an HTML file"
    done = subprocess.run(["python", "-m", "crawler", "status", str(report.parent)],
                          cwd=run.workdir, env=run.env, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT)
    if done.returncode != 0 or " finished" not in done.stdout:
        return f"status of the demo's crawl: exit {done.returncode}: {done.stdout[-500:]}"
    return None


def _dump_lines(res: Result, m: re.Match[str], run: _Run) -> str | None:
    text = (run.workdir / m.group(1)).read_text()
    good = text and all(re.match(r"[0-9a-f]{32}\t", ln) for ln in text.splitlines())
    return None if good else f"{m.group(1)} is not `<hex key>\\t<value>` lines"


def _indexed(res: Result, m: re.Match[str], run: _Run) -> str | None:
    found = re.search(r"^indexed ([\d,]+) pages", res.stdout, re.M)
    if found is None or int(found.group(1).replace(",", "")) == 0:
        return "no `indexed N pages` line with N > 0"
    return None


def _ranked_hits(res: Result, m: re.Match[str], run: _Run) -> str | None:
    """At least one result, a snippet-bearing hit list, at most --limit of them."""
    hits = re.findall(r"^\d+\. ", res.stdout, re.M)
    if not hits or len(hits) > int(m.group(1)):
        return f"{len(hits)} numbered results (want 1..{m.group(1)})"
    if not re.search(r"^\d+ of [\d,]+ matching pages", res.stdout, re.M):
        return "no `N of M matching pages` line"
    return None


# What the README says a command's output is (in its comment or the text around it),
# checked lightly: (pattern on the command as run, check -> a problem or None).
OUTPUT_CHECKS: list[tuple[re.Pattern[str], Callable[[Result, re.Match[str], _Run], str | None]]] = [
    (re.compile(r"^python -m crawler demo\b"), _demo_made),
    (re.compile(r"^python -m crawler pages .*--limit (\d+)"), _one_line_per_page),
    (re.compile(r"^python -m crawler show \S+ (\S+)"), _shows_url),
    (re.compile(r"^python -m crawler status "), _says_state),
    (re.compile(r"^python -m crawler export .*--warc "), _warcs_check),
    (re.compile(r"^python -m crawler export .*--jsonl (\S+)"), _json_lines),
    (re.compile(r"^python -m crawler export .*--wacz (\S+)"), _wacz_package),
    (re.compile(r"^python -m crawler report .*--out (\S+\.html)"), _html_file),
    (re.compile(r"^python -m kvstore dump .*> (\S+)"), _dump_lines),
    (re.compile(r"^python -m crawler index "), _indexed),
    (re.compile(r"^python -m crawler search .*--limit (\d+)"), _ranked_hits),
]


def _check(result: Result, run: _Run) -> None:
    """What the README says of every command's output, and of this one's."""
    if "Traceback (most recent call last)" in result.stderr:
        result.problems.append("a traceback on stderr")
    lines = (result.stdout + result.stderr).splitlines()
    # The crawl's sample status line is seen because the crawl (the README's --crawl-delay
    # kept: 10-15 s here) outlasts the 5 s status interval.
    for head in rb.sample_heads(result.plan.command.sample):
        if not any(head in line for line in lines):
            result.problems.append(f"no output line like the README's sample {head!r}...")
    if result.problems or result.plan.kind != "run":
        return
    for pattern, check in OUTPUT_CHECKS:
        match = pattern.search(result.ran)
        try:
            problem = check(result, match, run) if match else None
        except (OSError, ValueError, subprocess.SubprocessError) as exc:  # a missing file...
            problem = f"{check.__name__}: {exc!r}"
        if problem:
            result.problems.append(problem)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Result]]:
    workdir = tmp_path_factory.mktemp("readme")
    bindir = tmp_path_factory.mktemp("readme-bin")
    tmpdir = tmp_path_factory.mktemp("readme-tmp")
    for name in ("python", "python3"):  # `python` as the README types it: this interpreter
        wrapper = bindir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        wrapper.chmod(0o755)
    run = _Run(workdir, bindir, tmpdir)
    results: dict[int, Result] = {}
    try:
        for p in PLANS:
            started = time.monotonic()
            result = results[p.command.line] = run.run(p)
            result.seconds = time.monotonic() - started
            if result.plan.kind != "web":  # checked once stopped
                _check(result, run)  # now: a later command may change its files
    finally:
        run.stop_web()
    if run.web_result is not None:
        _check(run.web_result, run)
    yield results


def _id(p: Plan) -> str:
    return f"L{p.command.line}:" + ("python block" if p.command.python else p.code[:60])


def test_a_sample_line_promises_its_text_up_to_a_number_or_a_path() -> None:
    sample = ('crawl complete: {"complete": true, "fetched": 2618, ...}',
              "demo: wrote the report: /tmp/kvcrawl-demo-x/report.html",
              "to crawl a real site: python -m crawler start https://example.com/ --data s",
              "12 pages", "...")
    assert rb.sample_heads(sample) == [
        'crawl complete: {"complete": true, "fetched":', "demo: wrote the report:",
        "to crawl a real site: python -m crawler start https://example.com/ --data s"]


def test_a_section_is_its_lines_to_the_next_heading_of_its_level() -> None:
    text = ("# Top\n## Install\n```\npip install -e .\n# a comment, not a heading\n```\n"
            "### Detail\n```\npython -m crawler demo\n```\n## Tests\n```\npython -m pytest\n```\n")
    install = rb.section(text, "## Install")
    assert len(install.splitlines()) == len(text.splitlines())  # README line numbers kept
    found = rb.commands(install, lambda word: word in ("pip", "python"))
    assert [(c.line, c.code) for c in found] == [(4, "pip install -e ."),
                                                  (9, "python -m crawler demo")]
    with pytest.raises(ValueError, match="no heading"):
        rb.section(text, "## Install and first crawl")


def test_the_readme_has_commands_to_run() -> None:
    """The parser finds the README's blocks (an empty list would test nothing)."""
    kinds = {p.kind for p in PLANS}
    assert {"python", "run", "web"} <= kinds, [(_id(p), p.kind) for p in PLANS]


@pytest.mark.slow
@pytest.mark.parametrize("readme_plan", PLANS, ids=_id)
def test_readme_command(readme_plan: Plan, readme_run: dict[int, Result]) -> None:
    result = readme_run[readme_plan.command.line]
    earlier = [n for n, r in readme_run.items() if n < readme_plan.command.line and r.problems]
    hint = f"\n  (it may follow from the failures at README lines {earlier})" if earlier else ""
    assert not result.problems, result.report() + hint
