"""Start a throwaway PostgreSQL server for tests (no pytest dependency).

Usage::

    with TemporaryPostgres() as pg:
        with psycopg.connect(pg.dsn) as conn:
            ...

If ``CONTEXTFOLD_TEST_PG_DSN`` is set, that external server is used instead of starting one.
``CONTEXTFOLD_PG_BIN`` overrides the directory holding ``initdb``/``pg_ctl``/``postgres``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

PG_BIN_ENV = "CONTEXTFOLD_PG_BIN"
EXTERNAL_DSN_ENV = "CONTEXTFOLD_TEST_PG_DSN"
DEFAULT_DBNAME = "contextfold_test"
SUPERUSER = "postgres"
SERVER_OS_USER = "postgres"
HOST = "127.0.0.1"

_REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")
_INSTALL_HINT = (
    "install PostgreSQL server binaries (Debian/Ubuntu: `apt-get install -y postgresql`), "
    f"or set {PG_BIN_ENV} to the directory containing initdb/pg_ctl/postgres, "
    f"or set {EXTERNAL_DSN_ENV} to the URL of an existing server"
)
_SERVER_SETTINGS: dict[str, str] = {
    "listen_addresses": HOST,
    "max_connections": "200",
    "timezone": "UTC",
    # Parallel workers use dynamic shared memory, which is tiny in some containers.
    "max_parallel_workers_per_gather": "0",
}


class PostgresNotFoundError(RuntimeError):
    """PostgreSQL server binaries could not be located."""


def find_pg_bin() -> Path:
    """Return the directory holding initdb, pg_ctl and postgres.

    Order: ``$CONTEXTFOLD_PG_BIN``, ``pg_ctl`` on PATH, newest ``/usr/lib/postgresql/*/bin``.
    """
    override = os.environ.get(PG_BIN_ENV)
    if override:
        path = Path(override)
        if not _has_binaries(path):
            raise PostgresNotFoundError(
                f"{PG_BIN_ENV}={override!r} does not contain executable "
                f"{', '.join(_REQUIRED_BINARIES)}"
            )
        return path
    on_path = shutil.which("pg_ctl")
    if on_path:
        # Resolve symlinks so initdb/postgres come from the same installation as pg_ctl.
        for candidate in (Path(os.path.realpath(on_path)).parent, Path(on_path).parent):
            if _has_binaries(candidate):
                return candidate
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    for candidate in debian:
        if _has_binaries(candidate):
            return candidate
    raise PostgresNotFoundError(f"PostgreSQL server binaries not found: {_INSTALL_HINT}")


def dsn_with_dbname(dsn: str, dbname: str) -> str:
    """Return ``dsn`` as a ``postgresql://`` URL pointing at database ``dbname``."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        path = "/" + quote(dbname, safe="")
        return urlunsplit(("postgresql", parts.netloc, path, parts.query, ""))
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    params.pop("dbname", None)
    userinfo = ""
    if "user" in params:
        userinfo = quote(params.pop("user"), safe="")
        if "password" in params:
            userinfo += ":" + quote(params.pop("password"), safe="")
        userinfo += "@"
    netloc = userinfo + quote(params.pop("host", ""), safe="")
    if "port" in params:
        netloc += ":" + params.pop("port")
    return urlunsplit(("postgresql", netloc, "/" + quote(dbname, safe=""), urlencode(params), ""))


class TemporaryPostgres:
    """A PostgreSQL server in a temporary directory, alive for the ``with`` block.

    Exposes ``dsn``/``url`` (database ``contextfold_test``), ``admin_dsn`` (database
    ``postgres``) and ``create_database``/``drop_database`` for per-test databases.
    """

    def __init__(
        self,
        *,
        dbname: str = DEFAULT_DBNAME,
        bin_dir: str | Path | None = None,
        external_dsn: str | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self.dbname = dbname
        self.startup_timeout = startup_timeout
        self.external_dsn = external_dsn or os.environ.get(EXTERNAL_DSN_ENV) or None
        self.bin_dir: Path | None = Path(bin_dir) if bin_dir is not None else None
        self.base_dir: Path | None = None
        self.port: int | None = None
        self._owner: pwd.struct_passwd | None = None
        self._dsn: str | None = None
        self._admin_dsn: str | None = None

    # -- public API ---------------------------------------------------------------------

    @property
    def external(self) -> bool:
        """True when using ``$CONTEXTFOLD_TEST_PG_DSN`` instead of a server we started."""
        return self.external_dsn is not None

    @property
    def dsn(self) -> str:
        """``postgresql://`` URL of the test database."""
        if self._dsn is None:
            raise RuntimeError("TemporaryPostgres is not started")
        return self._dsn

    @property
    def url(self) -> str:
        """Alias of :attr:`dsn`."""
        return self.dsn

    @property
    def admin_dsn(self) -> str:
        """URL for administrative statements such as CREATE DATABASE."""
        if self._admin_dsn is None:
            raise RuntimeError("TemporaryPostgres is not started")
        return self._admin_dsn

    @property
    def data_dir(self) -> Path:
        return self._base() / "data"

    @property
    def socket_dir(self) -> Path:
        return self._base() / "run"

    @property
    def log_path(self) -> Path:
        return self._base() / "postgres.log"

    def dsn_for(self, dbname: str) -> str:
        """URL of database ``dbname`` on this server."""
        if self.external_dsn is not None:
            return dsn_with_dbname(self.external_dsn, dbname)
        if self.port is None:
            raise RuntimeError("TemporaryPostgres is not started")
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/{quote(dbname, safe='')}"

    def create_database(self, name: str | None = None) -> str:
        """Create a database (default: ``cf_<random hex>``) and return its name."""
        import psycopg
        from psycopg import sql

        name = name or f"cf_{secrets.token_hex(8)}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, terminating any connections still open to it."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def start(self) -> TemporaryPostgres:
        """Start the server (or attach to the external one); idempotent."""
        if self._dsn is not None:
            return self
        if self.external_dsn is not None:
            self._admin_dsn = self.external_dsn
            self._dsn = self.external_dsn
            return self
        self.bin_dir = self.bin_dir or find_pg_bin()
        self._owner = _server_owner()
        self.base_dir = Path(
            tempfile.mkdtemp(prefix="contextfold-pg-", dir=_temp_root(self._owner))
        )
        atexit.register(self.stop)
        try:
            self.socket_dir.mkdir()
            if self._owner is not None:
                for path in (self.base_dir, self.socket_dir):
                    os.chown(path, self._owner.pw_uid, self._owner.pw_gid)
            self._initdb()
            self._start_server()
            self._admin_dsn = self.dsn_for("postgres")
            self._wait_until_accepting()
            self.create_database(self.dbname)
            self._dsn = self.dsn_for(self.dbname)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server and delete its directory; idempotent."""
        self._dsn = None
        self._admin_dsn = None
        if self.base_dir is None:
            return
        atexit.unregister(self.stop)
        try:
            self._stop_server()
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
            self.port = None

    def restart(self) -> None:
        """Restart the server on its port as after a crash (immediate shutdown: every
        connection drops), and wait until it accepts connections again."""
        if self.external_dsn is not None or self.port is None:
            raise RuntimeError("only a started TemporaryPostgres can be restarted")
        self._come_back("restart", "restart", "--mode=immediate")

    def halt(self) -> None:
        """Stop the server as after a crash (immediate shutdown: every connection drops),
        keeping its data and port for :meth:`resume`: an outage."""
        if self.external_dsn is not None or self.port is None:
            raise RuntimeError("only a started TemporaryPostgres can be halted")
        self._stop_server()

    def resume(self) -> None:
        """Start a halted server again on its port and wait until it accepts connections."""
        if self.external_dsn is not None or self.port is None:
            raise RuntimeError("only a halted TemporaryPostgres can be resumed")
        self._come_back("resume", "start")

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------

    def _base(self) -> Path:
        if self.base_dir is None:
            raise RuntimeError("TemporaryPostgres is not started")
        return self.base_dir

    def _bin(self, name: str) -> str:
        assert self.bin_dir is not None
        return str(self.bin_dir / name)

    def _run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a server binary, as the ``postgres`` OS user when we are root."""
        owner = self._owner
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        return subprocess.run(
            args,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd=self._base(),
            env=env,
            timeout=timeout,
            check=False,
            user=owner.pw_uid if owner else None,
            group=owner.pw_gid if owner else None,
            extra_groups=[] if owner else None,
        )

    def _initdb(self) -> None:
        result = self._run(
            [
                self._bin("initdb"),
                f"--pgdata={self.data_dir}",
                f"--username={SUPERUSER}",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            timeout=180,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{result.stdout}{result.stderr}")
        settings = {**_SERVER_SETTINGS, "unix_socket_directories": str(self.socket_dir)}
        with open(self.data_dir / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\n# contextfold test settings\n")
            for key, value in settings.items():
                conf.write(f"{key} = '{value.replace(chr(39), chr(39) * 2)}'\n")

    def _pg_ctl_on_port(self, command: str, *options: str) -> subprocess.CompletedProcess[str]:
        """``pg_ctl start`` or ``restart`` on :attr:`port`, waiting for it to finish."""
        return self._run(
            [
                self._bin("pg_ctl"),
                f"--pgdata={self.data_dir}",
                f"--log={self.log_path}",
                *options,
                "--wait",
                f"--timeout={int(self.startup_timeout)}",
                f"--options=-p {self.port}",
                command,
            ],
            timeout=self.startup_timeout + 30,
        )

    def _come_back(self, what: str, command: str, *options: str) -> None:
        """Bring the server up again on its port and wait until it accepts connections."""
        result = self._pg_ctl_on_port(command, *options)
        if result.returncode != 0:
            raise RuntimeError(f"could not {what} PostgreSQL:\n{result.stderr}{self._log_tail()}")
        self._wait_until_accepting()

    def _start_server(self) -> None:
        last_error = ""
        for _ in range(5):
            self.port = _free_port()
            result = self._pg_ctl_on_port("start")
            if result.returncode == 0:
                return
            log = self._log_tail()
            last_error = f"{result.stdout}{result.stderr}\n--- server log ---\n{log}"
            self._stop_server()
            if "could not bind" not in log and "already in use" not in log:
                break  # only a lost port race is worth retrying
        raise RuntimeError(f"could not start PostgreSQL:\n{last_error}")

    def _wait_until_accepting(self) -> None:
        import psycopg

        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                with psycopg.connect(self.admin_dsn, connect_timeout=5):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL did not accept connections: {exc}\n{self._log_tail()}"
                    ) from exc
                time.sleep(0.1)

    def _stop_server(self) -> None:
        pid_file = self.data_dir / "postmaster.pid"
        if not pid_file.exists():
            return
        pg_ctl = self._bin("pg_ctl")
        result = self._run(
            [pg_ctl, f"--pgdata={self.data_dir}", "--mode=immediate", "--wait", "stop"], timeout=90
        )
        if result.returncode == 0 or not pid_file.exists():
            return
        with contextlib.suppress(ValueError, OSError, IndexError):
            pid = int(pid_file.read_text().splitlines()[0])
            # pg_ctl starts the postmaster in its own session, so the group is the whole server.
            os.killpg(pid, signal.SIGKILL)

    def _log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"


def _has_binaries(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in _REQUIRED_BINARIES)


def _version_key(bin_dir: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", bin_dir.parent.name))


def _server_owner() -> pwd.struct_passwd | None:
    """The OS user to run the server as: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, but PostgreSQL refuses to run as root and there is no "
            f"{SERVER_OS_USER!r} OS user; install the postgresql package or "
            f"`useradd --system {SERVER_OS_USER}`"
        ) from None


def _temp_root(owner: pwd.struct_passwd | None) -> str:
    """A temp root the server user can traverse (``$TMPDIR`` may be private to root)."""
    root = tempfile.gettempdir()
    if owner is None:
        return root
    path = Path(root).resolve()
    for directory in (path, *path.parents):
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            return "/tmp"
    return root


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port
