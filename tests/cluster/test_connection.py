"""The shared tier's connection (`tiers.shared.connection`) against real redis-servers: Redis
AUTH (`redis://:password@`), an ACL user (`redis://user:password@`), the password in the query,
and TLS (`rediss://`, a CA made here with openssl); a wrong password or an unknown CA is a clear
error; the password never appears in an error, in `redacted`, or in the serve flag's message."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kvswap.cluster.procs import ManagedProcess, find_binary, free_port, start_redis
from kvswap.config.errors import ConfigError
from kvswap.config.flags import parse_serve_args
from kvswap.tiers.shared.connection import TierURLError, connect, redacted
from tests.cluster.util import wait_until

pytestmark = pytest.mark.timeout(60)
SECRET = "s3cret-Pa55"


@pytest.fixture()
def auth_redis(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    proc = start_redis(port, tmp_path, tmp_path / "redis.log", persistent=False, password=SECRET)
    yield port
    proc.stop()


def test_redacted_hides_every_form_of_the_password() -> None:
    cases = {
        "redis://:pw@h:6379/0": "redis://:***@h:6379/0",
        "redis://user:pw@h:6379/0": "redis://user:***@h:6379/0",
        "rediss://u:p%40ss@h/0?ssl_ca_certs=/ca.pem": "rediss://u:***@h/0?ssl_ca_certs=/ca.pem",
        "redis://h:6379/0?password=pw&db=1": "redis://h:6379/0?password=***&db=1",
        "unix:///run/r.sock?db=0&Password=pw": "unix:///run/r.sock?db=0&Password=***",
        "redis://user@h:6379/0": "redis://user@h:6379/0",  # no password: unchanged
        "redis://:pw@h:notaport/0": "redis://:***@h:notaport/0",  # malformed: still hidden
        "redis://h:6379/0": "redis://h:6379/0",
        "redis://:pw@h:6379/0#a@b": "redis://:***@h:6379/0#a@b",
    }
    assert {url: redacted(url) for url in cases} == cases


def test_auth_in_the_url_user_part_and_query(auth_redis: int) -> None:
    port = auth_redis
    assert connect(f"redis://:{SECRET}@127.0.0.1:{port}/0").ping()
    assert connect(f"redis://127.0.0.1:{port}/0?password={SECRET}").ping()
    with pytest.raises(redis.exceptions.AuthenticationError) as refused:
        connect(f"redis://127.0.0.1:{port}/0").ping()  # Redis asks for AUTH
    with pytest.raises(redis.exceptions.AuthenticationError) as wrong:
        connect(f"redis://:not-{SECRET}@127.0.0.1:{port}/0").ping()
    for err in (refused.value, wrong.value):
        assert SECRET not in str(err)
    admin = connect(f"redis://:{SECRET}@127.0.0.1:{port}/0")
    admin.acl_setuser(
        "kvswap", enabled=True, passwords=["+tier-pw"], keys=["kv:*"], commands=["+@all"]
    )
    tier = connect(f"redis://kvswap:tier-pw@127.0.0.1:{port}/0")
    assert tier.set("kv:{x}:probe", b"1") and tier.get("kv:{x}:probe") == b"1"
    with pytest.raises(redis.exceptions.NoPermissionError):
        tier.set("other", b"1")  # the ACL user is confined to the tier's keys


def test_a_bad_url_names_the_problem_without_the_password() -> None:
    with pytest.raises(TierURLError) as bad_scheme:
        connect(f"http://:{SECRET}@127.0.0.1:1/0")
    with pytest.raises(TierURLError) as bad_db:
        connect(f"redis://:{SECRET}@127.0.0.1:1/0?socket_timeout=soon")
    for err in (bad_scheme.value, bad_db.value):
        assert SECRET not in str(err) and "***" in str(err)
    with pytest.raises(ConfigError) as flag:
        parse_serve_args(["--shared-tier", f"http://:{SECRET}@h:1/0"], {})
    assert "--shared-tier" in str(flag.value) and SECRET not in str(flag.value)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(
        [find_binary("openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=60
    )


def _make_certs(d: Path) -> None:
    """A CA, and a server certificate it signed for 127.0.0.1 and localhost."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "1", "-subj", "/CN=kvswap-test-ca", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
             "-subj", "/CN=localhost", cwd=d)  # fmt: skip
    (d / "ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "srv.crt", "-days", "1", "-extfile", "ext", cwd=d)  # fmt: skip


def test_tls_with_the_servers_ca(tmp_path: Path) -> None:
    _make_certs(tmp_path)
    port = free_port()
    argv = [
        find_binary("redis-server"), "--port", "0", "--tls-port", str(port),
        "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
        "--tls-cert-file", str(tmp_path / "srv.crt"), "--tls-key-file", str(tmp_path / "srv.key"),
        "--tls-ca-cert-file", str(tmp_path / "ca.crt"), "--tls-auth-clients", "no",
        "--requirepass", SECRET,
    ]  # fmt: skip
    proc = ManagedProcess("redis-tls", argv, tmp_path / "redis.log")
    try:
        url = f"rediss://:{SECRET}@127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'ca.crt'}"

        def answers() -> bool:
            try:
                return bool(connect(url).ping())
            except redis.exceptions.ConnectionError:
                return False

        wait_until(answers, 30, "redis-server to answer over TLS")
        client = connect(url)
        assert client.set("k", b"v") and client.get("k") == b"v"
        with pytest.raises(redis.exceptions.ConnectionError) as untrusted:
            connect(f"rediss://:{SECRET}@127.0.0.1:{port}/0").ping()  # system CAs only
        assert "certificate verify failed" in str(untrusted.value)
        with pytest.raises(redis.exceptions.ConnectionError):
            connect(f"redis://:{SECRET}@127.0.0.1:{port}/0").ping()  # plain text to a TLS port
    finally:
        proc.stop()
