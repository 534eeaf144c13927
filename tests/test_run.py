"""run.py, the README's two commands, on a machine as Debian ships it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import run

# Debian's python3.11 without python3.11-venv: ``python3 -m venv`` makes the folder and
# its python, then stops where ensurepip would put pip in it.
DEBIAN_PYTHON = """#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  shift 2
  "{real}" -m venv --without-pip "$@" || exit 1
  echo "The virtual environment was not created successfully because ensurepip is not" >&2
  echo "available.  On Debian/Ubuntu systems, you need to install the python3-venv package" >&2
  exit 1
fi
exec "{real}" "$@"
"""


@pytest.fixture
def debian(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """A Python whose venv module cannot put pip in a venv, and apt-get recorded, not run."""
    python = tmp_path / "python3"
    python.write_text(DEBIAN_PYTHON.format(real=sys.executable))
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setattr(run, "VENV", tmp_path / ".venv")
    monkeypatch.setattr(run, "PY", tmp_path / ".venv" / "bin" / "python")
    asked: list[tuple[str, ...]] = []

    def apt_install(*packages: str) -> bool:
        asked.append(packages)
        return False

    monkeypatch.setattr(run, "apt_install", apt_install)
    return asked


def test_a_python_without_ensurepip_asks_for_its_venv_package_and_says_so(
    debian: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        run.ensure_venv("requirements.txt")
    assert stopped.value.code == 1
    package = f"python3.{sys.version_info[1]}-venv"
    assert debian == [(package,)]
    said = capsys.readouterr().out
    assert f"sudo apt-get install {package}" in said and "could not create .venv" in said
    # Nothing was installed into the venv that came out without pip, and a second run
    # tries again rather than taking it for a venv.
    assert not run.has_pip()
    with pytest.raises(SystemExit):
        run.ensure_venv("requirements.txt")
    assert len(debian) == 2


def _drop_role(role: str) -> None:
    import os
    import shutil
    import subprocess

    sql = f"DROP ROLE IF EXISTS {role}"
    psql = ["psql", "-X", "-q", "-d", "postgres", "-c", sql]
    if os.geteuid() == 0 and shutil.which("runuser"):
        psql = ["runuser", "-u", "postgres", "--", *psql]
    else:
        psql = [*psql, "-h", "127.0.0.1", "-U", "postgres"]
    subprocess.run(psql, capture_output=True, timeout=60)


def test_two_checkouts_keep_each_their_own_test_role_and_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each checkout's run sets its own role's password: a run in one checkout leaves the
    other's tests able to log in (one role for both had its password changed under them)."""
    import psycopg

    urls, roles = [], []
    try:
        for name in ("one", "two"):
            checkout = tmp_path / name
            (checkout / ".venv").mkdir(parents=True)
            monkeypatch.setattr(run, "ROOT", checkout)
            monkeypatch.setattr(run, "VENV", checkout / ".venv")
            roles.append(run.test_role())
            env: dict[str, str] = {}
            run.test_database_server(env)
            urls.append(env["LLMGW_TEST_DATABASE_SERVER"])
        assert roles[0] != roles[1]
        monkeypatch.setattr(run, "ROOT", tmp_path / "one")
        assert run.test_role() == roles[0]  # the same checkout, the same role
        for url in urls:  # the first still logs in after the second's run
            with psycopg.connect(url + "/postgres", connect_timeout=10) as conn:
                assert conn.execute("SELECT current_user").fetchone()[0] in roles
    finally:
        for role in roles:
            _drop_role(role)
