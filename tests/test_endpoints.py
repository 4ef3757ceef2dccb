"""Endpoints as the CLI's URLs and the Airflow connections give them (core/endpoints.py): TLS,
the extras the MySQL and clickhousedb providers document, what is refused by name, secrets kept
out of logs and staged files, certificates written 0600 (no servers: the fast tier)."""

from __future__ import annotations

import json
import logging
import os
import stat
from urllib.parse import quote

import pytest

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.core.specfile import public_dict, spec_from_dict, spec_to_dict
from airflow_sync_provider.core.submission import KEY_ENV, SECRET_ENV, secrets_from_env, stage
from airflow_sync_provider.core.tls import pem_file
from devenv.certs import Certificates

PASSWORD = "p@ss:w/rd%#?&= x'\"\\+;"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certificates(tmp_path_factory.mktemp("certs")).make()


def url(query: str = "", password: str = PASSWORD) -> str:
    return f"mysql://sync:{quote(password, safe='')}@db.example:3307/shop" + (f"?{query}" if query else "")


def test_a_password_with_every_awkward_character_survives_percent_encoding():
    endpoint = MySQLEndpoint.from_url(url())
    assert (endpoint.user, endpoint.password, endpoint.host, endpoint.port, endpoint.database) == \
        ("sync", PASSWORD, "db.example", 3307, "shop")
    assert endpoint.ssl_mode == "DISABLED"  # nothing given: plain text, as before (docs/connections.md)
    assert PASSWORD not in repr(endpoint)


def test_tls_parameters_their_aliases_and_the_mode_each_implies(certs):
    ca = quote(certs.ca, safe="")
    for query, mode in ((f"ssl_mode=VERIFY_CA&ssl_ca={ca}", "VERIFY_CA"),
                        (f"ssl-mode=verify_ca&ssl-ca={ca}", "VERIFY_CA"),
                        (f"sslmode=verify-full&sslca={ca}", "VERIFY_IDENTITY"), (f"ssl_ca={ca}", "VERIFY_IDENTITY"),
                        ("ssl=true", "REQUIRED"), ("ssl=1", "REQUIRED"), ("sslmode=require", "REQUIRED"),
                        ("ssl_mode=PREFERRED", "PREFERRED"), ("ssl=false", "DISABLED")):
        assert MySQLEndpoint.from_url(url(query)).ssl_mode == mode, query
    endpoint = MySQLEndpoint.from_url(url(f"ssl_mode=VERIFY_IDENTITY&ssl_ca={ca}&ssl_cert={quote(certs.client_cert)}"
                                          f"&ssl_key={quote(certs.client_key)}&init_command=SET+%40a+%3D+1"
                                          "&connect_timeout=7&charset=utf8mb4"))
    with open(certs.ca) as fh:
        assert endpoint.ssl_ca == fh.read()  # the contents travel, not the path
    assert "PRIVATE KEY" in endpoint.ssl_key and "CERTIFICATE" in endpoint.ssl_cert
    assert (endpoint.init_command, endpoint.connect_timeout) == ("SET @a = 1", 7.0)
    text = repr(endpoint)
    assert "PRIVATE KEY" not in text and "CERTIFICATE" not in text and "ssl_mode='VERIFY_IDENTITY'" in text
    args = endpoint.connect_args()
    assert args["ssl"]["check_hostname"] and args["ssl"]["verify_mode"] and args["init_command"] == "SET @a = 1"
    assert MySQLEndpoint.from_url(url(f"ssl_mode=VERIFY_CA&ssl_ca={ca}")).connect_args()["ssl"]["check_hostname"] \
        is False


def test_what_cannot_be_honoured_is_refused_by_name(certs, tmp_path):
    ca = quote(certs.ca, safe="")
    refused = {
        "sslcompression=1": "unknown parameter 'sslcompression'",
        "ssl_mode=VERIFY_CA": "needs the CA",
        "ssl_mode=STRICT": "ssl_mode='STRICT' is not one of",
        f"ssl_mode=REQUIRED&ssl_ca={ca}": "ssl_ca is used by VERIFY_CA and VERIFY_IDENTITY only",
        f"ssl_mode=DISABLED&ssl_ca={ca}": "ssl_mode=DISABLED with TLS settings",
        f"ssl_mode=REQUIRED&ssl_cert={quote(certs.client_cert)}": "needs both ssl_cert and ssl_key",
        "ssl_mode=VERIFY_CA&ssl_ca=/nonexistent/ca.pem": "ssl_ca='/nonexistent/ca.pem' cannot be read",
        "charset=latin1": "charset='latin1' cannot be honoured",
        "unix_socket=/run/mysqld/mysqld.sock": "unix_socket='/run/mysqld/mysqld.sock' cannot be honoured",
        "connect_timeout=-1": "connect_timeout='-1' must be a number of seconds",
        f"ssl_ca={ca}&ssl_ca={ca}": "a parameter is given twice",
        f"ssl_ca={ca}&sslca={ca}": "'ssl_ca' and 'sslca' both set ssl_ca",
    }
    for query, message in refused.items():
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            MySQLEndpoint.from_url(url(query))
    (tmp_path / "der.pem").write_bytes(b"\x30\x82\x01")
    with pytest.raises(ValueError, match="holds no PEM block"):
        MySQLEndpoint.from_url(url(f"ssl_mode=VERIFY_CA&ssl_ca={tmp_path / 'der.pem'}"))
    with pytest.raises(ValueError, match="not 'localhost'"):
        MySQLEndpoint.from_url(f"mysql://u:p@localhost/db?ssl_mode=VERIFY_CA&ssl_ca={ca}")


def test_a_key_inside_the_certificate_file_is_kept_apart_as_the_secret(certs, tmp_path):
    both = tmp_path / "both.pem"
    both.write_text(open(certs.client_cert).read() + open(certs.client_key).read())
    endpoint = MySQLEndpoint.from_url(url(f"ssl_mode=REQUIRED&ssl_cert={quote(str(both))}"))
    assert "PRIVATE KEY" not in endpoint.ssl_cert and "PRIVATE KEY" in endpoint.ssl_key


def _hook(monkeypatch, conn_id: str, connection: dict):
    from airflow_sync_provider.hooks.endpoints import SyncEndpointsHook

    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
    return SyncEndpointsHook(mysql_conn_id=conn_id, clickhouse_conn_id=conn_id)


def test_the_mysql_providers_extras(monkeypatch, certs, caplog):
    """Exactly the MySQL provider's extras: the ``ssl`` dict (or its JSON text), ``ssl_mode``,
    ``charset``, ``init_command``, ``connect_timeout`` honoured; ``cursor``/``client``/
    ``local_infile`` (its hook's choices) logged as not applied; ``unix_socket``, ``iam``,
    ``ssl.capath`` refused by name."""
    base = {"conn_type": "mysql", "host": "db.example", "port": 3306, "login": "sync", "password": PASSWORD,
            "schema": "shop"}
    ssl = {"ca": certs.ca, "cert": certs.client_cert, "key": certs.client_key}
    caplog.set_level(logging.INFO)
    hook = _hook(monkeypatch, "src", base | {"extra": {"ssl": ssl, "ssl_mode": "VERIFY_CA", "charset": "utf8",
                                                       "cursor": "sscursor", "client": "mysqlclient",
                                                       "init_command": "SET SESSION lock_wait_timeout = 60"}})
    endpoint = hook.source()
    assert (endpoint.ssl_mode, endpoint.password, endpoint.database) == ("VERIFY_CA", PASSWORD, "shop")
    assert endpoint.ssl_cert and endpoint.ssl_key and endpoint.init_command.startswith("SET SESSION")
    assert "cursor='sscursor' not applied" in caplog.text and "charset='utf8' read as utf8mb4" in caplog.text
    as_text = _hook(monkeypatch, "src", base | {"extra": {"ssl": json.dumps({"ca": certs.ca})}}).source()
    assert as_text.ssl_mode == "VERIFY_IDENTITY"  # a CA without a mode: the strictest it allows, as pymysql does
    for extra, message in (({"unix_socket": "/var/socket"}, "unix_socket='/var/socket' cannot be honoured"),
                           ({"iam": True}, "AWS IAM authentication is not supported"),
                           ({"ssl": {"capath": "/etc/ssl/certs"}}, "ssl.capath cannot be honoured"),
                           ({"ssl": {"ca": certs.ca, "cipher": "AES"}}, "ssl.cipher is not supported"),
                           ({"sslmode": "require", "ssl_mode": "REQUIRED"}, "both set ssl_mode")):
        with pytest.raises(ValueError, match=message) as caught:
            _hook(monkeypatch, "src", base | {"extra": extra}).source()
        assert "connection 'src' (mysql)" in str(caught.value)


def test_the_clickhousedb_providers_extras_and_the_https_url(monkeypatch, certs, caplog):
    caplog.set_level(logging.INFO)
    base = {"conn_type": "clickhouse", "host": "ch.example", "login": "default", "password": "pw", "schema": "dw"}
    hook = _hook(monkeypatch, "ch", base | {"extra": {
        "secure": True, "verify": True, "compress": True, "connect_timeout": 5, "send_receive_timeout": 600,
        "client_kwargs": {"ca_cert": certs.ca, "client_cert": certs.client_cert, "client_cert_key": certs.client_key,
                          "server_host_name": "ch.internal", "tls_mode": "strict"}}})
    target = hook.target()
    assert (target.port, target.secure, target.server_host_name, target.tls_mode) == (8443, True, "ch.internal",
                                                                                      "strict")
    args = target.client_args()
    assert args["ca_cert"] != certs.ca and open(args["ca_cert"]).read() == open(certs.ca).read()
    assert (args["connect_timeout"], args["send_receive_timeout"], args["verify"]) == (5.0, 600.0, True)
    assert target.insert_compression == "lz4" and "PRIVATE KEY" not in repr(target)  # compress=True: LZ4
    for extra, message in (({"session_settings": {"max_threads": 2}}, "session_settings cannot be honoured"),
                           ({"client_kwargs": {"http_proxy": "http://p:1"}}, "client_kwargs.http_proxy cannot be"),
                           ({"client_kwargs": {"ca_cert": certs.ca}}, "ca_cert need HTTPS")):
        with pytest.raises(ValueError, match=message):
            _hook(monkeypatch, "ch", base | {"extra": extra}).target()
    url = ClickHouseEndpoint.from_url(f"https://u:p@ch.example/dw?ca_cert={quote(certs.ca)}&verify=false"
                                      "&server_host_name=ch.internal")
    assert (url.port, url.verify, url.server_host_name) == (8443, False, "ch.internal") and url.ca_cert
    assert ClickHouseEndpoint.from_url("https://ch.example/?ca_cert=certifi").client_args()["ca_cert"] == "certifi"
    with pytest.raises(ValueError, match="unknown parameter 'compression'"):
        ClickHouseEndpoint.from_url("http://ch.example/?compression=lz4")
    with pytest.raises(ValueError, match="ca_cert need HTTPS"):
        ClickHouseEndpoint.from_url(f"http://ch.example/?ca_cert={quote(certs.ca)}")


def test_inserts_are_compressed_for_a_remote_server_and_not_on_this_machine():
    """Unset, a remote server's inserts are LZ4 and a loopback one's plain; set, as given."""
    cases = {"http://ch.example/": "lz4", "http://10.0.0.7:8123/": "lz4", "http://127.0.0.1:8123/": None,
             "http://localhost/": None, "http://[::1]:8123/": None, "http://127.0.0.1/?compress=zstd": "zstd",
             "http://127.0.0.1/?compress=true": "lz4", "http://ch.example/?compress=false": None,
             "http://ch.example/?compress=none": None}
    assert {url: ClickHouseEndpoint.from_url(url).insert_compression for url in cases} == cases
    with pytest.raises(ValueError, match="compress='gzip'"):
        ClickHouseEndpoint.from_url("http://ch.example/?compress=gzip")


def test_certificates_are_written_0600_in_a_private_directory_once_per_content(monkeypatch, tmp_path, certs):
    import tempfile

    from airflow_sync_provider.core import tls

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tls, "_FILES", {})
    content = open(certs.client_key).read()
    path = pem_file(content)
    assert pem_file(content) == path and open(path).read() == content
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    os.unlink(path)
    assert pem_file(content) == path and os.path.exists(path)  # written again when something removed it


def _tls_spec(certs) -> FullLoadSpec:
    source = MySQLEndpoint.from_url(url(f"ssl_mode=VERIFY_IDENTITY&ssl_ca={quote(certs.ca)}"
                                        f"&ssl_cert={quote(certs.client_cert)}&ssl_key={quote(certs.client_key)}"))
    target = ClickHouseEndpoint.from_url(f"https://default:chpw@ch.example/?ca_cert={quote(certs.ca)}"
                                         f"&client_cert={quote(certs.client_cert)}"
                                         f"&client_cert_key={quote(certs.client_key)}")
    return FullLoadSpec(sources=one_server(source), target=target, source_database="shop", source_table="t",
                        target_database="shop", target_table="t")


def test_private_keys_are_masked_and_stay_out_of_a_cluster_mode_staged_spec(certs, tmp_path, monkeypatch):
    spec = _tls_spec(certs)
    key = spec.source.ssl_key
    public = json.dumps(public_dict(spec))
    assert PASSWORD not in public and key.splitlines()[1] not in public and "BEGIN" not in public
    assert public_dict(spec)["sources"][0]["endpoint"]["ssl_ca"].startswith("<PEM: 1 block(s), sha256 ")
    assert spec_from_dict(spec_to_dict(spec)) == spec  # the job spec carries everything, executors too
    staged = stage(spec, str(tmp_path), "yarn", "cluster", kubernetes_secret="sync")
    shipped = (tmp_path / "spec.json").read_text()
    assert key.splitlines()[1] not in shipped and PASSWORD not in shipped and "BEGIN CERTIFICATE" in shipped
    assert staged.conf[f"spark.kubernetes.driver.secretKeyRef.{KEY_ENV['source'][2]}"] == "sync:mysql-ssl-key"
    assert staged.conf[f"spark.kubernetes.driver.secretKeyRef.{KEY_ENV['target'][2]}"] == "sync:clickhouse-tls-key"
    driver = spec_from_dict(json.loads(shipped))
    for variable in SECRET_ENV.values():
        monkeypatch.setenv(variable, "pw")
    with pytest.raises(RuntimeError, match=KEY_ENV["source"][2]):
        secrets_from_env(driver)
    monkeypatch.setenv(KEY_ENV["source"][2], key)
    monkeypatch.setenv(KEY_ENV["target"][2], spec.target.client_cert_key)
    secrets_from_env(driver)
    assert driver.source.ssl_key == key and driver.target.client_cert_key == spec.target.client_cert_key
